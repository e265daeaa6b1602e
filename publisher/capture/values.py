"""Values set in place for snapshot chunks: the hot loop of every source's snapshot.

:func:`value_writer` returns, for one column type, a function that sets a
``pb.Value`` to exactly what :func:`common.values.encode` would return, without
building and copying a Value for the common cases.  :func:`rows_chunk` is an
empty rows chunk of a table, for the caller's own loop to fill.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from common.rpc import txrepl_pb2 as pb
from common.values import encode, encode_natural, to_datetime, to_decimal

__all__ = ["rows_chunk", "value_writer"]


_INTEGER = pb.COLUMN_TYPE_INTEGER
_FLOAT = pb.COLUMN_TYPE_FLOAT
_TEXT = pb.COLUMN_TYPE_TEXT
_DECIMAL = pb.COLUMN_TYPE_DECIMAL
_TIMESTAMP = pb.COLUMN_TYPE_TIMESTAMP
_TIMESTAMPTZ = pb.COLUMN_TYPE_TIMESTAMPTZ


def value_writer(ctype: int, scale: int) -> Callable[[pb.Value, object], None]:
    """``write(out, v)``: set ``out`` to exactly what ``encode(v, ctype, scale)`` returns.

    The snapshot's hot loop: the common cases are set in place (no Value built and
    copied, no walk through every logical type); anything else goes through
    :func:`common.values.encode` itself.
    """

    def generic(out: pb.Value, v: object) -> None:
        out.CopyFrom(encode(v, ctype, scale))

    if ctype in (_INTEGER, _FLOAT, _TEXT):
        exact, field = (
            (int, "int")
            if ctype == _INTEGER
            else (float, "float")
            if ctype == _FLOAT
            else (str, "text")
        )

        def simple(out: pb.Value, v: object) -> None:
            if type(v) is exact:
                try:
                    setattr(out, field, v)
                except UnicodeEncodeError:  # TEXT that is not UTF-8: see common.values
                    generic(out, v)
            elif v is None:
                out.null = True
            else:
                generic(out, v)

        return simple
    if ctype == _DECIMAL:

        def dec(out: pb.Value, v: object) -> None:
            if v is None:
                out.null = True
                return
            d = to_decimal(v, scale)
            if d is None:
                generic(out, v)
            else:
                out.decimal = str(d)

        return dec
    if ctype in (_TIMESTAMP, _TIMESTAMPTZ):
        zoned = ctype == _TIMESTAMPTZ

        def stamp(out: pb.Value, v: object) -> None:
            if v is None:
                out.null = True
                return
            ts = to_datetime(v)
            if ts is None:
                generic(out, v)
                return
            if zoned and ts.tzinfo is None:
                ts = ts.replace(tzinfo=dt.UTC)
            encode_natural(ts, out)

        return stamp
    return generic


def rows_chunk(table: str) -> pb.SnapshotChunk:
    """An empty rows chunk of ``table`` (the caller adds the rows in its own hot loop)."""
    chunk = pb.SnapshotChunk()
    chunk.rows.table = table
    return chunk
