"""Entries as flat serialized values, and column-wise decoding of those with numpy.

Reading values through the protobuf objects costs a Python wrapper per ``Value``
(about 1 us each, the floor of a per-value decoder).  Instead, an entry is
re-read (``SerializeToString`` + ``FromString``, both in C) as :data:`SEntry`, a
message with the same wire layout as ``txrepl.v1.Entry`` in which every ``Value``
of a row change is a ``bytes`` field holding the serialized ``Value``, and every
barrier (schema, SQL, call) stays serialized until it is met (the Python walk of
a batch; the numpy walk, :mod:`subscriber.apply._walk`, finds the same values as
spans of the serialized entries, and :func:`gather` copies a column's spans into
one array).  The values of one column then become ONE Arrow binary array, decoded
by :func:`decode_column` with vectorized numpy (varints, zigzag, length-delimited
payloads).

Only what the wire format fixes is assumed: a ``Value`` is empty (NULL) or holds
fields of the ``kind`` oneof.  A column whose cells are not all NULL or of the one
expected field, each spanning its whole ``Value`` (no unknown fields), is not
decoded here (``None``): the caller then parses the cells as ``Value`` objects.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.entry import AnyEntry

__all__ = ["SEntry", "SRow", "decode_column", "gather", "shadow", "warm_arrow"]

T = pb.ColumnType


def _shadow_classes() -> tuple[Any, Any]:
    f = descriptor_pb2.FileDescriptorProto(name="txrepl_shadow.proto", package="txrepl.shadow")
    f.syntax = "proto3"
    F = descriptor_pb2.FieldDescriptorProto
    row = f.message_type.add(name="SRow")
    row.field.add(name="table", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    row.field.add(name="op", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    row.field.add(name="key", number=3, type=F.TYPE_BYTES, label=F.LABEL_REPEATED)
    row.field.add(name="row", number=4, type=F.TYPE_BYTES, label=F.LABEL_REPEATED)
    row.field.add(name="truncate_options", number=5, type=F.TYPE_UINT32)
    op = f.message_type.add(name="SOp")
    op.oneof_decl.add(name="kind")
    op.field.add(
        name="row", number=1, type=F.TYPE_MESSAGE, type_name=".txrepl.shadow.SRow", oneof_index=0
    )
    for name, number in (("schema", 2), ("sql", 3), ("call", 4)):
        op.field.add(name=name, number=number, type=F.TYPE_BYTES, oneof_index=0)
    entry = f.message_type.add(name="SEntry")
    entry.field.add(name="commit_time_us", number=1, type=F.TYPE_SINT64)
    entry.field.add(name="source_position", number=2, type=F.TYPE_STRING)
    entry.field.add(
        name="ops",
        number=3,
        type=F.TYPE_MESSAGE,
        type_name=".txrepl.shadow.SOp",
        label=F.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return tuple(  # type: ignore[return-value]
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"txrepl.shadow.{name}"))
        for name in ("SEntry", "SRow")
    )


SEntry, SRow = _shadow_classes()  # SRow: a RowChange whose values are bytes


def shadow(entry: AnyEntry) -> Any:
    """The entry as an :data:`SEntry` (row values as serialized ``Value`` bytes)."""
    return SEntry.FromString(entry.SerializeToString())


# Per column type: the Value field number and its wire type.
_VARINT, _FIXED64, _LEN = 0, 1, 2
_FIELDS: dict[int, tuple[int, int]] = {
    T.COLUMN_TYPE_INTEGER: (2, _VARINT),
    T.COLUMN_TYPE_DECIMAL: (3, _LEN),
    T.COLUMN_TYPE_FLOAT: (4, _FIXED64),
    T.COLUMN_TYPE_TEXT: (5, _LEN),
    T.COLUMN_TYPE_BYTES: (6, _LEN),
    T.COLUMN_TYPE_BOOLEAN: (7, _VARINT),
    T.COLUMN_TYPE_DATE: (8, _VARINT),
    T.COLUMN_TYPE_TIME: (9, _VARINT),
    T.COLUMN_TYPE_TIMESTAMP: (10, _VARINT),
    T.COLUMN_TYPE_TIMESTAMPTZ: (11, _LEN),
    T.COLUMN_TYPE_JSON: (12, _LEN),
}
_NULL_TAG = (1 << 3) | _VARINT  # Value.null (any value of it means NULL)
_ZIGZAG = {T.COLUMN_TYPE_INTEGER, T.COLUMN_TYPE_DATE, T.COLUMN_TYPE_TIME, T.COLUMN_TYPE_TIMESTAMP}


class _Bad(Exception):
    """The cells are not in the form this module decodes."""


def _varints(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode the varints starting at positions ``at``: (values as uint64, next positions).

    Reads at most 10 bytes from each ``at``, one round per byte over the varints
    not ended yet: work and memory in the number of varints, not in ``data``'s
    size (issue 21: the positions of every byte without continuation bit,
    searched before, took 8 bytes per byte of a column of large text values).
    A varint running past ``data``'s end, or longer than 10 bytes, is not read.
    """
    value = np.zeros(at.size, np.uint64)
    end = at.copy()
    more = np.arange(at.size)
    for i in range(10):
        if not more.size:
            return value, end
        pos = at[more] + i
        if pos.max() >= data.size:
            raise _Bad
        b = data[pos]
        value[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * i)
        end[more] = pos + 1
        more = more[b >= 0x80]
    if more.size:
        raise _Bad
    return value, end


def _unzigzag(v: np.ndarray) -> np.ndarray:
    out: np.ndarray = ((v >> np.uint64(1)) ^ (np.uint64(0) - (v & np.uint64(1)))).view(np.int64)
    return out


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _strings(
    atype: pa.DataType,
    data: np.ndarray,
    valid: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
) -> pa.Array:
    """An Arrow string/binary array of the payloads ``data[starts[i] : starts[i] + lengths[i]]``."""
    n = valid.size
    lens = np.zeros(n, np.int64)
    lens[valid] = lengths
    at = np.zeros(n, np.int64)
    at[valid] = starts
    taken = _taken(data, at, lens, atype)
    if taken is not None:
        return pa.Array.from_buffers(atype, n, [_validity(valid), *taken.buffers()[1:]])
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise _Bad
    first = offsets[:-1][valid]
    local = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(first, lengths)
    payload = data[np.repeat(starts, lengths) + local]
    return pa.Array.from_buffers(
        atype,
        n,
        [_validity(valid), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(payload)],
    )


def _taken(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, atype: pa.DataType
) -> pa.Array | None:
    """The spans copied by Arrow's ``take`` when they follow each other in ``data``
    (the usual case: cells in op order); None when they do not, or ``data`` is too big.

    Spans in increasing order, each ending before the next starts, are the even
    elements of ONE array over ``data`` whose offsets alternate span starts and
    ends (the odd elements are the bytes between); ``take`` copies the even ones.
    An empty span may point anywhere: it is moved to where the span before ended.
    3.5 against 11.4 ms for 72,000 spans of 2-60 bytes, against the byte-index
    gather below (which indexes every byte through numpy).
    """
    n = starts.size
    if n == 0 or data.size >= 2**31:
        return None
    bounds = np.empty(2 * n, np.int64)
    empty = lengths == 0
    bounds[0::2] = np.where(empty, 0, starts)
    bounds[1::2] = np.where(empty, 0, starts + lengths)
    filled = np.maximum.accumulate(bounds)
    if not np.array_equal(filled[0::2][~empty], bounds[0::2][~empty]):
        return None  # some span starts before the one before it ended
    if filled[-1] > data.size:
        return None
    over = pa.Array.from_buffers(
        atype, 2 * n - 1, [None, pa.py_buffer(filled.astype(np.int32)), pa.py_buffer(data)]
    )
    return over.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))


def gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """ONE Arrow binary array of the byte spans ``data[starts[i] : starts[i] + lengths[i]]``.

    No NULLs: an empty span is ``b""`` (an empty ``Value``, i.e. SQL NULL, for the
    callers here).  The spans' total must stay below 2 GiB (32-bit offsets).
    """
    n = starts.size
    taken = _taken(data, starts, lengths, pa.binary())
    if taken is not None:
        return taken
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 2**31:
        raise ValueError("gather: 2 GiB or more in one binary array")
    # int32 indices when they fit: half the memory traffic of int64.
    itype = np.int32 if data.size < 2**31 else np.int64
    shift = (starts - offsets[:-1]).astype(itype)
    idx = np.arange(total, dtype=itype) + np.repeat(shift, lengths)
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data[idx])]
    )


def _binary(cells: list[bytes]) -> pa.Array:
    """ONE Arrow binary array of ``cells``: their bytes joined once, no builder.

    ``pa.array(cells)`` grows its buffer by doubling (reallocations held by
    Arrow's pool): about 3.5 times a column of large values at its peak.
    """
    if any(c is None for c in cells):
        raise _Bad
    offsets = np.zeros(len(cells) + 1, np.int64)
    np.cumsum([len(c) for c in cells], out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise _Bad
    return pa.Array.from_buffers(
        pa.binary(),
        len(cells),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(cells))],
    )


def decode_column(ctype: int, cells: list[bytes] | pa.Array) -> tuple[pa.Array, np.ndarray] | None:
    """The typed in-flight Arrow column of serialized ``Value`` cells, or None.

    ``cells``: the serialized values, as a list or as one Arrow binary array (see
    :func:`gather`).  Returns the array and its validity mask (False: NULL).  For
    TIMESTAMPTZ the array is a struct of ``utc_us`` and ``offset_s`` (the caller
    formats the text).
    """
    spec = _FIELDS.get(ctype)
    if spec is None:
        return None
    try:
        return _decode(ctype, spec, cells)
    except _Bad:
        return None


def _decode(
    ctype: int, spec: tuple[int, int], cells: list[bytes] | pa.Array
) -> tuple[pa.Array, np.ndarray]:
    number, wire = spec
    n = len(cells)
    arr = cells if isinstance(cells, pa.Array) else _binary(cells)
    if not isinstance(arr, pa.Array) or arr.offset or arr.type != pa.binary() or arr.null_count:
        raise _Bad
    offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1).astype(np.int64)
    raw = arr.buffers()[2]
    total = int(offsets[-1])
    # The cells' bytes in place (no copy: a column of large values is read, not
    # duplicated); a single zero byte when every cell is empty.
    data = np.frombuffer(raw, np.uint8, total) if total else np.zeros(1, np.uint8)
    starts = offsets[:-1]
    sizes = offsets[1:] - starts
    tags = np.where(sizes > 0, data[np.minimum(starts, data.size - 1)], 0)
    valid = tags == ((number << 3) | wire)
    null = (sizes == 0) | ((tags == _NULL_TAG) & (sizes == 2))
    if not (valid | null).all():
        raise _Bad
    at = starts[valid] + 1
    stop = offsets[1:][valid]
    if ctype == T.COLUMN_TYPE_FLOAT:
        if not (sizes[valid] == 9).all():
            raise _Bad
        out = np.zeros(n, np.float64)
        out[valid] = data[at[:, None] + np.arange(8)].copy().view("<f8").ravel()
        return pa.Array.from_buffers(pa.float64(), n, [_validity(valid), pa.py_buffer(out)]), valid
    if wire == _VARINT:
        v, nxt = _varints(data, at)
        if not (nxt == stop).all():
            raise _Bad
        if ctype == T.COLUMN_TYPE_BOOLEAN:
            flags = np.zeros(n, np.bool_)
            flags[valid] = v != 0
            return pa.array(flags, mask=~valid), valid
        vals = np.zeros(n, np.int64)
        vals[valid] = _unzigzag(v) if ctype in _ZIGZAG else v.view(np.int64)
        if ctype == T.COLUMN_TYPE_DATE:
            if vals.min(initial=0) < -(2**31) or vals.max(initial=0) >= 2**31:
                raise _Bad
            days = vals.astype(np.int32)
            return pa.Array.from_buffers(
                pa.date32(), n, [_validity(valid), pa.py_buffer(days)]
            ), valid
        return pa.Array.from_buffers(pa.int64(), n, [_validity(valid), pa.py_buffer(vals)]), valid
    length, body = _varints(data, at)
    length = length.astype(np.int64)
    if not (body + length == stop).all():
        raise _Bad
    if ctype == T.COLUMN_TYPE_TIMESTAMPTZ:
        return _timestamptz(data, valid, body, stop), valid
    atype = pa.binary() if ctype == T.COLUMN_TYPE_BYTES else pa.string()
    return _strings(atype, data, valid, body, length), valid


def _timestamptz(
    data: np.ndarray, valid: np.ndarray, body: np.ndarray, stop: np.ndarray
) -> pa.Array:
    """``utc_us`` and ``offset_s`` of TimestampTz bodies, as a two-column struct array."""
    n = valid.size
    m = body.size
    utc = np.zeros(m, np.uint64)
    off = np.zeros(m, np.uint64)
    pos = body.copy()
    for number, out in ((1, utc), (2, off)):
        has = (pos < stop) & (data[np.minimum(pos, data.size - 1)] == ((number << 3) | _VARINT))
        v, nxt = _varints(data, pos[has] + 1)
        out[has] = v
        pos[has] = nxt
    if not (pos == stop).all():
        raise _Bad
    utc_all = np.zeros(n, np.int64)
    off_all = np.zeros(n, np.int64)
    utc_all[valid] = _unzigzag(utc)
    off_all[valid] = _unzigzag(off)
    return pa.StructArray.from_arrays(
        [pa.array(utc_all), pa.array(off_all)], names=["utc_us", "offset_s"]
    )


def warm_arrow() -> None:
    """Load now what pyarrow loads on its first use, rather than in the first batch.

    pyarrow's first array built from Python or numpy values imports pandas (its
    pandas shim checks every input; pandas is installed beside pyspark), and the
    first ``take`` loads the compute kernels: about 0.2 s of CPU, paid until now
    inside the first batch's plan (a cold 1,000-entry W1 plan 0.27 s, warm 0.01 s).
    Called once at the daemon's start, before its imports are frozen.
    """
    import pyarrow.compute  # noqa: F401  (the kernels: take, filter, if_else)

    pa.array([0], pa.int64()).take(pa.array([0], pa.int64()))
