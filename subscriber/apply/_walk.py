"""A batch's ops walked with numpy over the serialized entries: no Python per op.

Bytes.  The entries are serialized (``SerializeToString``, in C) and joined into
one buffer, followed by 16 zero bytes so that a read a little past any message
stays in bounds.  One *level* of messages is read by :func:`_fields`, given the
messages' spans: pass ``j`` reads the ``j``-th field of every message not yet
exhausted, all at once -- the tag byte at the message's cursor (one of the
level's tags below: one byte, a varint or length-delimited field), then a varint
(1-10 bytes, decoded in unrolled masked steps: the field's value, or the length
of its payload, then at most 5 bytes); the field must end within its message,
and the cursor moves to its end.  Passes go on while at least :data:`_SCALAR`
messages remain; the few long ones left (an entry of 10,000 ops) are finished by
a plain loop, field by field, with the same rules.  The fields come out message
by message in wire order (scattered to ``first[message] + n``, no sort).  Levels
and what is accepted:

- ``Entry``: fields 1, 4, 5, 6 (varint), 2, 3, 7 and 8 (length-delimited); each field
  3 is an op.
- ``Op``: exactly one field, 1 (RowChange), 2 (TableSchema), 3 (SqlStatement) or
  4 (ProcedureCall), length-delimited, spanning the whole op.
- ``RowChange``: 1 (table) at most once, 2 (op) at most once as a one-byte
  varint, 3 (key ``Value``) and 4 (row ``Value``) any number of times, in any
  order.  A ``Value`` is not read: its span (the field's payload, the same bytes
  the shadow entry's ``bytes`` fields of :mod:`subscriber.apply._wire` hold) is
  kept; the spans of one column become ONE Arrow binary array (``gather``), which
  ``decode_column`` decodes.  Table names are gathered the same way and
  dictionary-encoded by Arrow.

Anything else (another field or wire type, a longer tag, a repeated table or op,
a row op of more than one byte, a length of more than 5 bytes, an empty op, a
field overrunning its message, a batch of 2 GiB or more) makes :func:`walk`
return None: the caller then walks the batch in Python, the reference this module
reproduces.

Events of a segment (:meth:`Walked.events`, row changes between two barriers):
per table (in order of first appearance), each row change is checked against the
table's schema -- INSERT/UPDATE: as many row values as columns; DELETE, and an
UPDATE carrying a key: as many key values as key columns; row op INSERT, UPDATE
or DELETE.  A failed check raises :class:`Unrecognised` (the Python walk then
raises the error with its seq and table).  An UPDATE's key changed when one of its
serialized key values differs from the row's key cell (lengths, then the bytes,
gathered and compared at once).  A row change makes ``1 + changed`` events (the
delete of the old key first); ``_pos`` is the segment's first position plus the
exclusive cumulative sum of those counts, in op order.  Upserts take the row's
spans; deletes take the key's spans in the key columns and empty spans (NULL)
elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._events import EventBuffer, WireEvents
from subscriber.apply._wire import SRow, gather

__all__ = ["Unrecognised", "Walked", "walk"]

_PAD = 16  # zero bytes after the entries: varint reads past a message stay in bounds
_SCALAR = 16  # below this many messages left, a loop per field is cheaper than a pass
_VARINT, _LEN = 0, 2

_INSERT = int(pb.ROW_OP_INSERT)
_UPDATE = int(pb.ROW_OP_UPDATE)
_DELETE = int(pb.ROW_OP_DELETE)
_TRUNCATE = int(pb.ROW_OP_TRUNCATE)


def _tag(number: int, wire: int) -> int:
    return (number << 3) | wire


def _tags(*tags: int) -> np.ndarray:
    table = np.zeros(256, np.bool_)
    table[list(tags)] = True
    return table


# 4-6: the group fields (common/fragments.py), read by the batcher, not here; 7 (origin,
# _origin.py) and 8 (sequence positions, _sequences.py): read from the marks, not here.
_ENTRY_TAGS = _tags(
    _tag(1, _VARINT),
    _tag(2, _LEN),
    _tag(3, _LEN),
    *(_tag(n, _VARINT) for n in (4, 5, 6)),
    *(_tag(n, _LEN) for n in (7, 8)),
)
_OP_TAGS = _tags(*(_tag(n, _LEN) for n in (1, 2, 3, 4)))
_ROW_TAGS = _tags(_tag(1, _LEN), _tag(2, _VARINT), _tag(3, _LEN), _tag(4, _LEN))
_OPS = _tag(3, _LEN)
_TABLE, _ROWOP, _KEY, _ROW = _tag(1, _LEN), _tag(2, _VARINT), _tag(3, _LEN), _tag(4, _LEN)


class Unrecognised(Exception):
    """Not in the form this module reads: the batch takes the Python walk."""


def _varints(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints starting at ``at`` (at most 10 bytes): (values, end positions).

    The values are exact up to 5 bytes (all a length needs); longer ones only end.
    """
    b = data[at]
    value = (b & 0x7F).astype(np.int64)
    more = np.flatnonzero(b >= 0x80)
    if not more.size:
        return value, at + 1
    end = at + 1
    for i in range(1, 10):
        b = data[at[more] + i]
        if i < 5:
            value[more] |= (b & 0x7F).astype(np.int64) << (7 * i)
        end[more] += 1
        more = more[b >= 0x80]
        if not more.size:
            return value, end
    raise Unrecognised("varint of more than 10 bytes")


def _varint(raw: bytes, at: int) -> tuple[int, int]:
    """One varint at ``at``, as :func:`_varints` reads it: (value, end position)."""
    value = 0
    for i in range(10):
        b = raw[at + i]
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return value, at + i + 1
    raise Unrecognised("varint of more than 10 bytes")


def _scalar_fields(
    raw: bytes,
    allowed: np.ndarray,
    m: int,
    at: int,
    end: int,
    nth: int,
    out: list[tuple[int, int, int, int, int]],
) -> int:
    """:func:`_fields`' rules, for the fields of message ``m`` from ``at``, one by one.

    Appends ``(m, n, tag, start, end)`` per field (``n`` counting from ``nth``) to
    ``out``; returns the message's number of fields.
    """
    ok = allowed.tobytes()
    append = out.append
    while at < end:
        tag = raw[at]
        if not ok[tag]:
            raise Unrecognised(f"tag {tag}")
        size = raw[at + 1]
        if size < 0x80:
            body = at + 2
        else:
            size, body = _varint(raw, at + 1)
        if tag & 7 == _LEN:
            if body - at > 6 or size >= 2**31:
                raise Unrecognised("length of more than 5 bytes")
            stop = body + size
        else:
            body, stop = at + 1, body
        if stop > end:
            raise Unrecognised("field overruns its message")
        append((m, nth, tag, body, stop))
        nth += 1
        at = stop
    return nth


@dataclass(frozen=True)
class _Fields:
    """The fields of N messages, message by message, in wire order."""

    msg: np.ndarray  # the message of each field
    tag: np.ndarray  # its (one-byte) tag
    start: np.ndarray  # its payload (length-delimited) or value bytes (varint)
    end: np.ndarray
    count: np.ndarray  # per message: number of fields


def _fields(
    data: np.ndarray, raw: bytes, starts: np.ndarray, ends: np.ndarray, allowed: np.ndarray
) -> _Fields:
    """Read the fields of the messages ``data[starts[i] : ends[i]]`` (see the module doc).

    ``allowed``: per tag byte, whether it may occur (one-byte tags of varint or
    length-delimited fields only).  Pass ``j`` reads the ``j``-th field of the
    messages still active (``act``, with their cursors and ends alongside).
    """
    n = starts.size
    act = np.flatnonzero(ends > starts)
    cur, lim = starts[act], ends[act]
    passes: list[tuple[np.ndarray, ...]] = []
    while act.size >= _SCALAR:
        tag = data[cur]
        if not allowed[tag].all():
            raise Unrecognised("tag")
        is_len = (tag & 7) == _LEN
        size, body = _varints(data, cur + 1)  # a length, or a varint field's value
        if (is_len & (body - cur > 6)).any():
            raise Unrecognised("length of more than 5 bytes")
        stop = np.where(is_len, body + size, body)
        if (stop > lim).any():
            raise Unrecognised("field overruns its message")
        passes.append((act, tag, np.where(is_len, body, cur + 1), stop))
        going = stop < lim
        if going.all():
            cur = stop
        else:
            act, cur, lim = act[going], stop[going], lim[going]
    count = np.zeros(n, np.int64)
    for j, p in enumerate(passes):
        count[p[0]] = j + 1
    scalar: list[tuple[int, int, int, int, int]] = []
    for i, m in enumerate(act.tolist()):
        count[m] = _scalar_fields(raw, allowed, m, int(cur[i]), int(lim[i]), len(passes), scalar)
    first = np.cumsum(count) - count
    total = int(count[-1] + first[-1]) if n else 0
    msg = np.empty(total, np.int64)
    tag_out = np.empty(total, np.uint8)
    start = np.empty(total, np.int64)
    end = np.empty(total, np.int64)
    for j, (a, t, b, e) in enumerate(passes):
        dest = first[a] + j
        msg[dest], tag_out[dest], start[dest], end[dest] = a, t, b, e
    if scalar:
        m_, k_, t_, s_, e_ = (np.array(c, np.int64) for c in zip(*scalar, strict=True))
        dest = first[m_] + k_
        msg[dest], tag_out[dest], start[dest], end[dest] = m_, t_, s_, e_
    return _Fields(msg, tag_out, start, end, count)


def _differ(
    data: np.ndarray, a: np.ndarray, a_len: np.ndarray, b: np.ndarray, b_len: np.ndarray
) -> np.ndarray:
    """Per pair, whether the spans ``(a, a_len)`` and ``(b, b_len)`` hold different bytes."""
    out: np.ndarray = a_len != b_len
    same = np.flatnonzero(~out)
    lengths = a_len[same]
    total = int(lengths.sum())
    if total:
        first = np.cumsum(lengths) - lengths
        local = np.arange(total, dtype=np.int64) - np.repeat(first, lengths)
        bad = data[np.repeat(a[same], lengths) + local] != data[np.repeat(b[same], lengths) + local]
        out[np.repeat(same, lengths)[bad]] = True
    return out


@dataclass(frozen=True)
class Walked:
    """A batch's ops, read from its serialized entries.

    Per op (batch order): ``op_entry`` (entry index), ``op_kind`` (1 row change,
    2 schema, 3 SQL, 4 call), ``op_start``/``op_end`` (the span of its payload,
    e.g. the serialized ``TableSchema``), ``op_row`` (row-change index of a row
    op).  Per row change: ``table`` (index into ``tables``), ``rowop``, its key
    values ``kfirst``/``kcount`` into ``kstart``/``klen``, its row values
    ``rfirst``/``rcount`` into ``rstart``/``rlen``.
    """

    raw: bytes
    data: np.ndarray
    op_entry: np.ndarray
    op_kind: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    op_row: np.ndarray
    rows: np.ndarray  # the op index of each row change
    table: np.ndarray
    tables: list[str]
    rowop: np.ndarray
    kfirst: np.ndarray
    kcount: np.ndarray
    kstart: np.ndarray
    klen: np.ndarray
    rfirst: np.ndarray
    rcount: np.ndarray
    rstart: np.ndarray
    rlen: np.ndarray

    @property
    def n_ops(self) -> int:
        return int(self.op_kind.size)

    def barriers(self) -> list[int]:
        """The op indices of the barriers: schema, SQL and call ops, TRUNCATEs."""
        barrier = self.op_kind != 1
        barrier[self.rows[self.rowop == _TRUNCATE]] = True
        out: list[int] = np.flatnonzero(barrier).tolist()
        return out

    def payload(self, op: int) -> bytes:
        return self.raw[int(self.op_start[op]) : int(self.op_end[op])]

    def row_change(self, r: int) -> Any:
        """Row change ``r`` as the Python walk reads it (an ``SRow``)."""
        return SRow.FromString(self.payload(int(self.rows[r])))

    def table_name(self, r: int) -> str:
        return self.tables[int(self.table[r])]

    def events(
        self, lo: int, hi: int, schemas: Mapping[str, pb.TableSchema], first_seq: int, pos: int
    ) -> tuple[dict[str, EventBuffer], int]:
        """The event buffers of row changes ``lo:hi`` (one segment), and the next ``_pos``.

        Raises :class:`Unrecognised` when a row change does not fit (the Python
        walk then raises the error).
        """
        code = self.table[lo:hi]
        op = self.rowop[lo:hi]
        if not ((op >= _INSERT) & (op <= _DELETE)).all():
            raise Unrecognised("unknown row op")
        kcount, rcount = self.kcount[lo:hi], self.rcount[lo:hi]
        kfirst, rfirst = self.kfirst[lo:hi], self.rfirst[lo:hi]
        order = np.argsort(code, kind="stable")
        cuts = np.flatnonzero(np.diff(code[order])) + 1
        groups = sorted(np.split(order, cuts), key=lambda g: int(g[0]))
        changed = np.zeros(hi - lo, np.bool_)
        plans: list[tuple[str, pb.TableSchema, np.ndarray, list[int], int]] = []
        for g in groups:
            name = self.tables[int(code[g[0]])]
            schema = schemas.get(name)
            if schema is None:
                raise Unrecognised("unknown table")
            names = [c.name for c in schema.columns]
            key_index = [names.index(k) for k in schema.primary_key]
            width = len(names)
            gop = op[g]
            delete = gop == _DELETE
            if (rcount[g][~delete] != width).any():
                raise Unrecognised("row width")
            update = (gop == _UPDATE) & (kcount[g] > 0)
            if (kcount[g][delete | update] != len(key_index)).any():
                raise Unrecognised("key width")
            if update.any():
                u = g[update]
                diff = np.zeros(u.size, np.bool_)
                for j, k in enumerate(key_index):
                    ka, ra = kfirst[u] + j, rfirst[u] + k
                    diff |= _differ(
                        self.data, self.kstart[ka], self.klen[ka], self.rstart[ra], self.rlen[ra]
                    )
                changed[u] = diff
            plans.append((name, schema, g, key_index, width))
        nev = 1 + changed.astype(np.int64)
        first_pos = pos + np.cumsum(nev) - nev
        entry = self.op_entry[self.rows[lo:hi]]
        out: dict[str, EventBuffer] = {}
        for name, schema, g, key_index, width in plans:
            gnev = nev[g]
            ev = np.repeat(g, gnev)
            sub = np.arange(ev.size, dtype=np.int64) - np.repeat(np.cumsum(gnev) - gnev, gnev)
            delete = (op[ev] == _DELETE) | (sub < nev[ev] - 1)  # a key change: delete first
            starts = np.zeros((width, ev.size), np.int64)
            lengths = np.zeros((width, ev.size), np.int64)
            up = np.flatnonzero(~delete)
            if up.size:
                at = rfirst[ev[up]][None, :] + np.arange(width, dtype=np.int64)[:, None]
                starts[:, up] = self.rstart[at]
                lengths[:, up] = self.rlen[at]
            down = np.flatnonzero(delete)
            if down.size:
                base = kfirst[ev[down]]
                for j, k in enumerate(key_index):
                    starts[k, down] = self.kstart[base + j]
                    lengths[k, down] = self.klen[base + j]
            wire = WireEvents(
                seqs=first_seq + entry[ev],
                positions=first_pos[ev] + sub,
                deletes=delete,
                ops=np.where(delete, _DELETE, op[ev]).astype(np.int8),
                data=self.data,
                starts=starts,
                lengths=lengths,
            )
            out[name] = EventBuffer.from_wire(schema, wire)
        return out, pos + int(nev.sum())


def walk(entries: Sequence[Any]) -> Walked | None:
    """The batch's ops read from its serialized entries, or None (see the module doc)."""
    try:
        return _walk(entries)
    except Unrecognised:
        return None


def _walk(entries: Sequence[Any]) -> Walked:
    pieces = [e.SerializeToString() for e in entries]
    sizes = np.fromiter(map(len, pieces), np.int64, len(pieces))
    raw = b"".join(pieces) + bytes(_PAD)
    if len(raw) >= 2**31:
        raise Unrecognised("batch of 2 GiB or more")
    data = np.frombuffer(raw, np.uint8)
    ends = np.cumsum(sizes)
    entry_fields = _fields(data, raw, ends - sizes, ends, _ENTRY_TAGS)
    of_op = entry_fields.tag == _OPS
    op_fields = _fields(data, raw, entry_fields.start[of_op], entry_fields.end[of_op], _OP_TAGS)
    if not (op_fields.count == 1).all():
        raise Unrecognised("empty op, or an op of more than one field")
    kind = (op_fields.tag >> 3).astype(np.int8)
    rows = np.flatnonzero(kind == 1)
    rc = _fields(data, raw, op_fields.start[rows], op_fields.end[rows], _ROW_TAGS)
    tag = rc.tag
    n = rows.size
    is_table, is_op = tag == _TABLE, tag == _ROWOP
    if n and (
        np.bincount(rc.msg[is_table], minlength=n).max() > 1
        or np.bincount(rc.msg[is_op], minlength=n).max() > 1
    ):
        raise Unrecognised("table or row op repeated")
    if not (rc.end[is_op] - rc.start[is_op] == 1).all():
        raise Unrecognised("row op of more than one byte")
    rowop = np.zeros(n, np.int64)
    rowop[rc.msg[is_op]] = data[rc.start[is_op]]
    tstart = np.zeros(n, np.int64)
    tlen = np.zeros(n, np.int64)
    tstart[rc.msg[is_table]] = rc.start[is_table]
    tlen[rc.msg[is_table]] = rc.end[is_table] - rc.start[is_table]
    encoded = pc.dictionary_encode(gather(data, tstart, tlen))
    try:
        tables = [b.decode() for b in encoded.dictionary.to_pylist()]
    except UnicodeDecodeError as exc:
        raise Unrecognised("table name is not UTF-8") from exc
    is_key, is_row = tag == _KEY, tag == _ROW
    kcount = np.bincount(rc.msg[is_key], minlength=n)
    rcount = np.bincount(rc.msg[is_row], minlength=n)
    op_row = np.full(kind.size, -1, np.int64)
    op_row[rows] = np.arange(n)
    return Walked(
        raw=raw,
        data=data,
        op_entry=entry_fields.msg[of_op],
        op_kind=kind,
        op_start=op_fields.start,
        op_end=op_fields.end,
        op_row=op_row,
        rows=rows,
        table=np.asarray(encoded.indices.to_numpy(zero_copy_only=False), np.int64),
        tables=tables,
        rowop=rowop,
        kfirst=np.cumsum(kcount) - kcount,
        kcount=kcount,
        kstart=rc.start[is_key],
        klen=rc.end[is_key] - rc.start[is_key],
        rfirst=np.cumsum(rcount) - rcount,
        rcount=rcount,
        rstart=rc.start[is_row],
        rlen=rc.end[is_row] - rc.start[is_row],
    )
