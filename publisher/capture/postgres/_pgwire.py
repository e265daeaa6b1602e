"""PostgreSQL row changes written straight to protobuf wire bytes (capture's hot loop).

Building a ``pb.Value`` per value, extending a ``RowChange`` with them (a copy),
sizing the ``Op`` and extending the ``Entry`` with it (another copy) was most of
the capture thread's time per W1 transaction (py-spy, 2026-11-25: ``_change``
~40 %).  Here each column of a relation gets, once, a function from its text
output to the bytes ``to_value(text, info).SerializeToString()`` gives
(``_pgtypes.py`` stays the one rule: both read the text with the same functions,
and a differential test holds the two equal over every type and its extremes);
a row change is written field by field, and the entry is parsed once, in C, from
its ops' bytes at the commit.  The bytes logged are the same as before.

The bytes, in field-number order (upb's order; ``protowire.py`` for the
primitives)::

    Op         0a len RowChange                    (row = 1)
    RowChange  0a len table                        (table = 1, UTF-8)
               10 op                               (op = 2: 1 insert, 2 update, 3 delete)
               1a len Value ...                    (key = 3: update and delete)
               22 len Value ...                    (row = 4: insert and update)
    Entry ops  1a len Op ...                       (ops = 3; ``entry_of``)

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

A Value is a oneof: its member is written even when it holds its type's zero
(``Value(int=0)`` is ``10 00``), unlike the plain fields of RowChange and
TimestampTz.  A text whose reading fails (``infinity``, BC dates, ``24:00:00``,
an integer past 64 bits, ...) goes through ``to_value``, which carries it as
text; an unchanged TOAST marker where a value is needed is refused.
"""

from __future__ import annotations

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
    DATE_TAG,
    DECIMAL_TAG,
    FLOAT_TAG,
    INT_TAG,
    JSON_TAG,
    NULL,
    SMALL,
    TEXT_TAG,
    TIME_TAG,
    TIMESTAMP_TAG,
    TZ_TAG,
    double,
    length,
    varint,
    zigzag,
)
from publisher.errors import SourceError

__all__ = ["RowWriter", "entry_of", "value_wire"]

T = pb.ColumnType
_FALLBACK = (ValueError, ArithmeticError, OverflowError)  # what to_value carries as text
_MIN, _MAX = -(2**63), 2**63
_TRUE, _FALSE = BOOLEAN_TAG + b"\x01", BOOLEAN_TAG + b"\x00"
_KEY, _ROW, _OPS = b"\x1a", b"\x22", b"\x1a"  # RowChange.key, RowChange.row, Entry.ops

Wire = Callable[[str], bytes]


def _integer(s: str) -> bytes:
    v = int(s)
    if _MIN <= v < _MAX:
        return INT_TAG + zigzag(v)
    raise OverflowError(f"integer out of 64 bits: {s}")


def _fast(ctype: int, scale: int) -> Wire:
    """text output -> the Value's bytes (raising as the reading of ``_pgtypes`` does)."""
    if ctype == T.COLUMN_TYPE_INTEGER:
        return _integer
    if ctype == T.COLUMN_TYPE_DECIMAL:
        quantum = quantum_of(scale)
        return lambda s: length(DECIMAL_TAG, decimal_text(s, quantum).encode())
    if ctype == T.COLUMN_TYPE_FLOAT:
        return lambda s: FLOAT_TAG + double(float(s))
    if ctype == T.COLUMN_TYPE_BYTES:
        return lambda s: length(BLOB_TAG, bytea(s))
    if ctype == T.COLUMN_TYPE_BOOLEAN:
        return lambda s: _TRUE if boolean(s) else _FALSE
    if ctype == T.COLUMN_TYPE_DATE:
        return lambda s: DATE_TAG + zigzag(date_days(s))
    if ctype == T.COLUMN_TYPE_TIME:
        return lambda s: TIME_TAG + zigzag(time_us(s))
    if ctype == T.COLUMN_TYPE_TIMESTAMP:
        return lambda s: TIMESTAMP_TAG + zigzag(timestamp_us(s))
    if ctype == T.COLUMN_TYPE_TIMESTAMPTZ:

        def timestamptz(s: str) -> bytes:
            utc = timestamptz_us(s)
            return length(TZ_TAG, b"\x08" + zigzag(utc) if utc else b"")

        return timestamptz
    if ctype == T.COLUMN_TYPE_JSON:
        return lambda s: length(JSON_TAG, s.encode())
    return lambda s: length(TEXT_TAG, s.encode())


def value_wire(info: TypeInfo) -> Callable[[Datum], bytes]:
    """A column's ``d -> to_value(d, info).SerializeToString()`` (None: NULL)."""
    fast = _fast(int(info.ctype), info.scale)

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


class RowWriter:
    """One relation's row changes as serialized ``Op`` messages."""

    __slots__ = ("_delete", "_insert", "_key", "_update", "_wires")

    def __init__(self, table: str, infos: Sequence[TypeInfo], key_idx: Sequence[int]) -> None:
        name = length(b"\x0a", table.encode()) if table else b""
        self._insert = name + b"\x10" + varint(pb.ROW_OP_INSERT)
        self._update = name + b"\x10" + varint(pb.ROW_OP_UPDATE)
        self._delete = name + b"\x10" + varint(pb.ROW_OP_DELETE)
        self._wires = tuple(value_wire(i) for i in infos)
        self._key = tuple(key_idx)

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


def entry_of(ops: Iterable[bytes]) -> pb.Entry:
    """An Entry holding ``ops`` (each a serialized Op), parsed once."""
    return pb.Entry.FromString(b"".join([length(_OPS, op) for op in ops]))
