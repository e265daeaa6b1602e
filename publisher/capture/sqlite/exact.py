"""SQLite values on the wire exactly as SQLite stored them.

SQLite keeps integers, reals, text and blobs in a column of any declared type; a
declared type with NUMERIC affinity (DECIMAL, BOOLEAN, DATE, TIME, TIMESTAMP, ...)
only turns well-formed numeric text into a number.  A value is therefore encoded in
the column's logical type only when that is *lossless*, i.e. a SQLite target that
declares the column the same way (``subscriber/targets/sqlite/writer.py: declared``)
stores the identical value and storage class again:

* DECIMAL: an integer (its decimal text is converted back to the integer); a finite
  real whose shortest decimal the column's scale does not round (converted back to the
  real).  Text stays text: SQLite kept it as text because it is not a number.
* BOOLEAN: the integers 0 and 1.
* DATE, TIME, TIMESTAMP, TIMESTAMPTZ: text that is already the ISO form the target
  writes back (``2024-02-29``, ``2024-02-29T12:34:56``); ``'2024-02-29 12:34:56'``
  (space) stays text.

Anything else travels as stored (``encode_natural``).  Lossless values keep the typed
wire forms that transforms (Spark SQL over the column's type), PostgreSQL targets and
the apply's typed Arrow columns rely on; the others make the column *variant* for that
batch.  Rejected: carrying every value of those columns as stored (exact too, but a
DECIMAL column of reals reaches Spark as serialized Values and a transform's
``CAST(amount AS DECIMAL(12,2))`` no longer analyses; every W1 batch went variant).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable

from common.rpc import txrepl_pb2 as pb
from common.values import encode, encode_natural, to_decimal

__all__ = ["encode_stored", "stored_writer"]

T = pb.ColumnType

_PARSE: dict[int, Callable[[str], object]] = {
    T.COLUMN_TYPE_DATE: dt.date.fromisoformat,
    T.COLUMN_TYPE_TIME: dt.time.fromisoformat,
    T.COLUMN_TYPE_TIMESTAMP: dt.datetime.fromisoformat,
    T.COLUMN_TYPE_TIMESTAMPTZ: dt.datetime.fromisoformat,
}
_CHECKED = frozenset({T.COLUMN_TYPE_DECIMAL, T.COLUMN_TYPE_BOOLEAN, *_PARSE})
# Plain ints: a protobuf enum attribute costs about 0.5 us per lookup, per value here.
_DECIMAL = int(T.COLUMN_TYPE_DECIMAL)
_BOOLEAN = int(T.COLUMN_TYPE_BOOLEAN)
_TIMESTAMPTZ = int(T.COLUMN_TYPE_TIMESTAMPTZ)


def _lossless(v: object, ctype: int, scale: int) -> bool:
    if isinstance(v, bool):
        return False
    if ctype == _DECIMAL:
        if isinstance(v, int):
            return True
        if isinstance(v, float) and v == v and abs(v) != float("inf"):
            try:
                return to_decimal(v, scale) == decimal.Decimal(repr(v))
            except decimal.InvalidOperation:  # beyond the context's precision at this scale
                return False
        return False
    if ctype == _BOOLEAN:
        return isinstance(v, int) and v in (0, 1)
    if not isinstance(v, str):
        return False
    try:
        parsed = _PARSE[ctype](v)
    except ValueError:
        return False
    if isinstance(parsed, dt.datetime):
        aware = parsed.tzinfo is not None
        if aware != (ctype == _TIMESTAMPTZ):
            return False
    return bool(parsed.isoformat() == v)  # type: ignore[attr-defined]


def encode_stored(v: object, ctype: int, scale: int) -> pb.Value:
    """``v`` in the column's logical type when lossless (module docstring), else as stored."""
    if v is None or ctype not in _CHECKED or _lossless(v, ctype, scale):
        return encode(v, ctype, scale)
    return encode_natural(v, pb.Value())


def stored_writer(ctype: int, scale: int) -> Callable[[pb.Value, object], None] | None:
    """A snapshot value writer for the columns :func:`encode_stored` checks (else None)."""
    if ctype not in _CHECKED:
        return None

    def write(out: pb.Value, v: object) -> None:
        out.CopyFrom(encode_stored(v, ctype, scale))

    return write
