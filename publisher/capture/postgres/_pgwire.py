"""PostgreSQL row changes written straight to protobuf wire bytes (capture's hot loop).

Building a ``pb.Value`` per value, extending a ``RowChange`` with them (a copy),
sizing the ``Op`` and extending the ``Entry`` with it (another copy), with a parsed
event object and a tuple of strings per row before that, was most of the capture
thread's time per W1 transaction (py-spy, 2026-11-25: ``_change`` ~40 %, the parse
~20 %).  Here each column of a relation gets, once, a function from its text output
to the bytes ``to_value(text, info).SerializeToString()`` gives (``_pgtypes.py``
stays the one rule: both read the text with the same functions, and a differential
test holds the two equal over every type and its extremes).

:meth:`RowWriter.from_message` reads a pgoutput I, U or D message straight into its
Op: each cell of the TupleData is decoded (UTF-8, as the parser does) and handed to
its column's function, and the Value's bytes are framed as they come; of an old row
('K' or 'O') only the key's columns are written, the others are decoded and
dropped.  Any message it does not take whole (a cell neither text nor NULL: an
unchanged TOAST value, binary; a column count other than the relation's; a message
cut short or of another form) returns None, and the session reads it through
``parse_pgoutput`` and the events as before, which refuses or handles it: the fast
path only ever sees what the generic one would write the same bytes for (a
differential test over random messages holds them equal).  The session appends the
ops' bytes without building an Entry (``Publication.append_encoded``).

The bytes, in field-number order (upb's order; ``protowire.py`` for the
primitives)::

    Op         0a len RowChange                    (row = 1)
    RowChange  0a len table                        (table = 1, UTF-8)
               10 op                               (op = 2: 1 insert, 2 update, 3 delete)
               1a len Value ...                    (key = 3: update and delete)
               22 len Value ...                    (row = 4: insert and update)
    Entry ops  1a len Op ...                       (ops = 3; ``protowire.framed``)

    Value      08 01                 NULL
               10 zigzag             INTEGER        (sint64; outside it: text)
               1a len text           DECIMAL        (``decimal_text``)
               21 8 bytes LE         FLOAT          (double)
               2a len UTF-8          TEXT, and every type carried as text
               32 len bytes          BYTES          (``bytea``)
               38 00 | 01            BOOLEAN
               40 zigzag             DATE           (sint32 days since 1970-01-01)
               48 zigzag             TIME           (sint64 us since midnight)
               50 zigzag             TIMESTAMP      (sint64 us since 1970-01-01)
               5a len (08 zigzag)?   TIMESTAMPTZ    (utc_us; offset_s always 0,
                                                     so never written; utc_us 0:
                                                     an empty message)
               62 len UTF-8          JSON

The zigzag types are set on a Value the column keeps and serialized by upb (0.27 us
against 0.44-0.86 for a varint written in Python); the others are written here.
A Value is a oneof: its member is written even when it holds its type's zero
(``Value(int=0)`` is ``10 00``), unlike the plain fields of RowChange and
TimestampTz.  A text whose reading fails (``infinity``, BC dates, ``24:00:00``,
an integer past 64 bits, ...) goes through ``to_value``, which carries it as
text; an unchanged TOAST marker where a value is needed is refused.  A RowWriter
keeps Values of its own: it is used by the one capture thread.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence

from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres._pgoutput import Datum
from publisher.capture.postgres._pgtypes import (
    TypeInfo,
    boolean,
    bytea,
    date_days,
    decimal_text,
    quantum_of,
    time_us,
    timestamp_us,
    timestamptz_us,
    to_value,
)
from publisher.capture.protowire import (
    BLOB_TAG,
    BOOLEAN_TAG,
    DECIMAL_TAG,
    FLOAT_TAG,
    JSON_TAG,
    NULL,
    SMALL,
    TEXT_TAG,
    double,
    length,
    varint,
)
from publisher.errors import SourceError

__all__ = ["RowWriter", "value_wire"]

T = pb.ColumnType
_FALLBACK = (ValueError, ArithmeticError, OverflowError)  # what to_value carries as text
_TRUE, _FALSE = BOOLEAN_TAG + b"\x01", BOOLEAN_TAG + b"\x00"
_KEY, _ROW = b"\x1a", b"\x22"  # RowChange.key, RowChange.row

Wire = Callable[[str], bytes]


def _kept(m: pb.Value, field: str, read: Callable[[str], int]) -> Wire:
    """``read(s)`` set as ``field`` of the kept Value ``m``, serialized."""

    def wire(s: str) -> bytes:
        setattr(m, field, read(s))
        return m.SerializeToString()

    return wire


_ZIGZAG: dict[int, tuple[str, Callable[[str], int]]] = {
    T.COLUMN_TYPE_DATE: ("date", date_days),
    T.COLUMN_TYPE_TIME: ("time_us", time_us),
    T.COLUMN_TYPE_TIMESTAMP: ("timestamp_us", timestamp_us),
}


def _fast(ctype: int, scale: int) -> Wire:
    """text output -> the Value's bytes (raising as the reading of ``_pgtypes`` does).

    The varint types set a Value kept for the column and let upb serialize it: faster
    than a varint written in Python (0.27 against 0.44-0.86 us), and the same bytes
    as ``to_value``'s (a value outside 64 bits raises ValueError there as here).
    """
    m = pb.Value()
    if ctype == T.COLUMN_TYPE_INTEGER:

        def integer(s: str) -> bytes:
            m.int = int(s)
            return m.SerializeToString()

        return integer
    if ctype == T.COLUMN_TYPE_DECIMAL:
        quantum = quantum_of(scale)
        return lambda s: length(DECIMAL_TAG, decimal_text(s, quantum).encode())
    if ctype == T.COLUMN_TYPE_FLOAT:
        return lambda s: FLOAT_TAG + double(float(s))
    if ctype == T.COLUMN_TYPE_BYTES:
        return lambda s: length(BLOB_TAG, bytea(s))
    if ctype == T.COLUMN_TYPE_BOOLEAN:
        return lambda s: _TRUE if boolean(s) else _FALSE
    if ctype in _ZIGZAG:
        return _kept(m, *_ZIGZAG[ctype])
    if ctype == T.COLUMN_TYPE_TIMESTAMPTZ:
        tz = m.timestamptz  # offset_s stays 0

        def timestamptz(s: str) -> bytes:
            tz.utc_us = timestamptz_us(s)
            return m.SerializeToString()

        return timestamptz
    if ctype == T.COLUMN_TYPE_JSON:
        return lambda s: length(JSON_TAG, s.encode())
    return lambda s: length(TEXT_TAG, s.encode())


def value_wire(info: TypeInfo) -> Callable[[Datum], bytes]:
    """A column's ``d -> to_value(d, info).SerializeToString()`` (None: NULL)."""
    return _wire(_fast(int(info.ctype), info.scale), info)


def _wire(fast: Wire, info: TypeInfo) -> Callable[[Datum], bytes]:
    def wire(d: Datum) -> bytes:
        if d.__class__ is str:
            try:
                return fast(d)
            except _FALLBACK:
                return to_value(d, info).SerializeToString()
        if d is None:
            return NULL
        raise SourceError("unchanged TOAST value where a full value is needed")

    return wire


def _values(
    tag: bytes, wires: Iterable[Callable[[Datum], bytes]], datums: Iterable[Datum]
) -> list[bytes]:
    out = []
    for wire, d in zip(wires, datums, strict=True):
        v = wire(d)
        n = len(v)
        out.append(tag + (SMALL[n] if n < 128 else varint(n)) + v)
    return out


_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_BAD = (struct.error, IndexError, UnicodeDecodeError)  # a message the parser refuses


def _skip(s: str) -> bytes:
    return b""  # a column of an old row that is not in the key: read, not written


Cells = tuple[tuple[Wire, TypeInfo], ...]  # each column's fast function and its type


def _image(buf: bytes, pos: int, cells: Cells) -> tuple[list[bytes], int] | None:
    """The TupleData at ``pos`` read straight into Values framed as ``RowChange.row``
    (``22 len Value``), and the position after it; None for anything but text and
    NULL cells, exactly ``len(cells)`` of them (the generic path then reads it, and
    refuses it or handles the unchanged TOAST values).  Raises one of ``_BAD`` where
    ``parse_pgoutput`` would refuse the message.  Each text goes as ``value_wire``
    takes it, inline: a call less per cell."""
    (n,) = _I16(buf, pos)
    if n != len(cells):
        return None
    pos += 2
    end = len(buf)
    out: list[bytes] = []
    append = out.append
    for fast, info in cells:
        kind = buf[pos]
        if kind == 0x74:  # 't'
            (size,) = _I32(buf, pos + 1)
            pos += 5
            if size < 0 or pos + size > end:
                return None
            text = buf[pos : pos + size].decode("utf-8")
            try:
                v = fast(text)
            except _FALLBACK:
                v = to_value(text, info).SerializeToString()
            pos += size
        elif kind == 0x6E:  # 'n'
            v = NULL
            pos += 1
        else:
            return None
        m = len(v)
        append(_ROW + (SMALL[m] if m < 128 else varint(m)) + v)
    return out, pos


class RowWriter:
    """One relation's row changes as serialized ``Op`` messages: from the events'
    tuples, or (:meth:`from_message`) straight from a pgoutput row message."""

    __slots__ = ("_cells", "_delete", "_insert", "_key", "_old", "_update", "_wires")

    def __init__(self, table: str, infos: Sequence[TypeInfo], key_idx: Sequence[int]) -> None:
        name = length(b"\x0a", table.encode()) if table else b""
        self._insert = name + b"\x10" + varint(pb.ROW_OP_INSERT)
        self._update = name + b"\x10" + varint(pb.ROW_OP_UPDATE)
        self._delete = name + b"\x10" + varint(pb.ROW_OP_DELETE)
        fasts = [_fast(int(i.ctype), i.scale) for i in infos]
        self._wires = tuple(_wire(f, i) for f, i in zip(fasts, infos, strict=True))
        self._cells: Cells = tuple(zip(fasts, infos, strict=True))
        self._key = tuple(key_idx)
        keys = set(self._key)
        self._old: Cells = tuple(
            c if n in keys else (_skip, c[1]) for n, c in enumerate(self._cells)
        )

    def _keys(self, image: Sequence[Datum]) -> list[bytes]:
        wires = self._wires
        return _values(_KEY, (wires[k] for k in self._key), (image[k] for k in self._key))

    def insert(self, new: Sequence[Datum]) -> bytes:
        body = b"".join(_values(_ROW, self._wires, new))
        return length(b"\x0a", self._insert + body)

    def update(self, key_image: Sequence[Datum], new: Sequence[Datum]) -> bytes:
        """``key_image``: the old row when the stream sent one, else the new row."""
        parts = self._keys(key_image)
        parts.extend(_values(_ROW, self._wires, new))
        return length(b"\x0a", self._update + b"".join(parts))

    def delete(self, old: Sequence[Datum]) -> bytes:
        return length(b"\x0a", self._delete + b"".join(self._keys(old)))

    def from_message(self, buf: bytes) -> bytes | None:
        """The Op of an I, U or D message (the relation's own), as :meth:`insert`,
        :meth:`update` or :meth:`delete` of its parsed event would write it; None when
        the generic path must read it (a cell neither text nor NULL, a column count
        that is not the relation's, anything malformed: that path raises)."""
        try:
            tag = buf[0]
            kind = buf[5]
            if tag == 0x49:  # 'I'
                if kind != 0x4E:
                    return None
                got = _image(buf, 6, self._cells)
                if got is None:
                    return None
                return length(b"\x0a", self._insert + b"".join(got[0]))
            old: list[bytes] | None = None
            pos = 6
            if kind == 0x4B or kind == 0x4F:  # 'K', 'O'
                got = _image(buf, 6, self._old)
                if got is None:
                    return None
                old, pos = got
                old = [_KEY + old[k][1:] for k in self._key]
                if tag == 0x44:  # 'D'
                    return length(b"\x0a", self._delete + b"".join(old))
                kind = buf[pos]
                pos += 1
            if tag != 0x55 or kind != 0x4E:  # 'U' ... 'N'
                return None
            got = _image(buf, pos, self._cells)
            if got is None:
                return None
            row = got[0]
            if old is None:
                old = [_KEY + row[k][1:] for k in self._key]
            return length(b"\x0a", self._update + b"".join(old) + b"".join(row))
        except _BAD:
            return None
