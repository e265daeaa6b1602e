"""PostgreSQL types -> txrepl logical types, and PostgreSQL text output -> Python values.

Both the stream (pgoutput and wal2json send each value's text output) and the snapshot
(COPY TO STDOUT, text format) see values as the type's text output function renders
them, under the session settings capture pins on every connection (:data:`SESSION_GUCS`):
UTC time zone, ISO dates, hex bytea, shortest-exact floats.  So one parser serves both.

=====================================  ==================  ===========================
PostgreSQL (base type of a domain)     ColumnType          value
=====================================  ==================  ===========================
smallint, integer, bigint, oid         INTEGER             int
numeric(p,s) / numeric                 DECIMAL (p, s)      Decimal (NaN, +-Infinity)
real, double precision                 FLOAT               float (exact: shortest repr)
text, varchar(n), char(n), name,       TEXT                str (char(n) keeps padding)
uuid, enums, anything else
bytea                                  BYTES               bytes
boolean                                BOOLEAN             bool
date                                   DATE                date
time                                   TIME                time
timestamp                              TIMESTAMP           naive datetime
timestamptz                            TIMESTAMPTZ         aware datetime, UTC (offset 0)
json, jsonb                            JSON                the document's text
=====================================  ==================  ===========================

Every column also carries ``pg_type`` (computed by
:func:`publisher.capture.postgres._pgcatalog.pg_target_type`): the type a PostgreSQL
target stores it in, the source's own built-in type (``uuid``, ``interval``, ``real``,
``json``, ``integer[]``, ...) or ``text`` for types only the source database defines; so
a value carried as its text output is parsed back by the same type's input function on
the target, and round-trips exactly.  docs/postgres.md has the table of every type.

PostgreSQL stores a timestamptz as a UTC instant without the writer's zone, so the
offset carried is always 0.  Values Python cannot hold (``infinity`` dates and
timestamps, BC dates, ``24:00:00``) are carried as their text rather than lost.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from typing import Final

from common.rpc import txrepl_pb2 as pb

__all__ = [
    "SESSION_GUCS",
    "TypeInfo",
    "boolean",
    "builtin_type",
    "bytea",
    "date_days",
    "decimal_text",
    "numeric_typmod",
    "quantum_of",
    "time_us",
    "timestamp_us",
    "timestamptz_us",
    "to_value",
]

T = pb.ColumnType

# Applied to every capture connection (stream and snapshot) through libpq ``options``.
SESSION_GUCS: Final = (
    "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres "
    "-c extra_float_digits=3 -c bytea_output=hex -c client_encoding=UTF8"
)

_BUILTIN: Final[dict[int, tuple[int, str]]] = {
    16: (T.COLUMN_TYPE_BOOLEAN, "boolean"),
    17: (T.COLUMN_TYPE_BYTES, "bytea"),
    18: (T.COLUMN_TYPE_TEXT, '"char"'),
    19: (T.COLUMN_TYPE_TEXT, "name"),
    20: (T.COLUMN_TYPE_INTEGER, "bigint"),
    21: (T.COLUMN_TYPE_INTEGER, "smallint"),
    23: (T.COLUMN_TYPE_INTEGER, "integer"),
    25: (T.COLUMN_TYPE_TEXT, "text"),
    26: (T.COLUMN_TYPE_INTEGER, "oid"),
    114: (T.COLUMN_TYPE_JSON, "json"),
    700: (T.COLUMN_TYPE_FLOAT, "real"),
    701: (T.COLUMN_TYPE_FLOAT, "double precision"),
    1042: (T.COLUMN_TYPE_TEXT, "character"),
    1043: (T.COLUMN_TYPE_TEXT, "character varying"),
    1082: (T.COLUMN_TYPE_DATE, "date"),
    1083: (T.COLUMN_TYPE_TIME, "time without time zone"),
    1114: (T.COLUMN_TYPE_TIMESTAMP, "timestamp without time zone"),
    1184: (T.COLUMN_TYPE_TIMESTAMPTZ, "timestamp with time zone"),
    1700: (T.COLUMN_TYPE_DECIMAL, "numeric"),
    2950: (T.COLUMN_TYPE_TEXT, "uuid"),
    3802: (T.COLUMN_TYPE_JSON, "jsonb"),
}


def builtin_type(oid: int) -> int | None:
    """The ColumnType of a built-in type OID, or None when the catalog must be asked."""
    hit = _BUILTIN.get(oid)
    return None if hit is None else hit[0]


def numeric_typmod(typmod: int) -> tuple[int, int]:
    """(precision, scale) of a numeric typmod; (0, 0) for unconstrained numeric."""
    if typmod < 4:
        return 0, 0
    t = typmod - 4
    return (t >> 16) & 0xFFFF, t & 0xFFFF


class TypeInfo:
    """The logical type of one column: its ColumnType, precision, scale and encoder."""

    __slots__ = ("ctype", "encode", "pg_type", "precision", "scale", "source_type")

    def __init__(
        self, ctype: int, precision: int, scale: int, source_type: str, pg_type: str = ""
    ) -> None:
        self.ctype = ctype
        self.precision = precision
        self.scale = scale
        self.source_type = source_type
        self.pg_type = pg_type
        self.encode: Callable[[str], pb.Value] = _encoder(int(ctype), scale)

    def column(self, name: str, nullable: bool) -> pb.Column:
        return pb.Column(
            name=name,
            type=self.ctype,  # type: ignore[arg-type]
            precision=self.precision,
            scale=self.scale,
            nullable=nullable,
            source_type=self.source_type,
            pg_type=self.pg_type,
        )


# Plain ints: attribute access on the generated enum wrapper costs microseconds.
_INTEGER = int(T.COLUMN_TYPE_INTEGER)
_DECIMAL = int(T.COLUMN_TYPE_DECIMAL)
_FLOAT = int(T.COLUMN_TYPE_FLOAT)
_BYTES = int(T.COLUMN_TYPE_BYTES)
_BOOLEAN = int(T.COLUMN_TYPE_BOOLEAN)
_DATE = int(T.COLUMN_TYPE_DATE)
_TIME = int(T.COLUMN_TYPE_TIME)
_TIMESTAMP = int(T.COLUMN_TYPE_TIMESTAMP)
_TIMESTAMPTZ = int(T.COLUMN_TYPE_TIMESTAMPTZ)
_JSON = int(T.COLUMN_TYPE_JSON)

_EPOCH_DATE_ORD: Final = dt.date(1970, 1, 1).toordinal()
_EPOCH: Final = dt.datetime(1970, 1, 1)
_EPOCH_UTC: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NULL: Final = pb.Value(null=True)


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# Text output -> the Value field's content, one function per type: the one rule that
# both :func:`_encoder` (Value objects) and ``_pgwire.py`` (their wire bytes) follow.
# Each raises ValueError, ArithmeticError or OverflowError on a value Python cannot
# hold, which is then carried as its text.


def quantum_of(scale: int) -> decimal.Decimal | None:
    """The quantum a numeric(p, ``scale``) value is quantized to (None: unconstrained)."""
    return decimal.Decimal(1).scaleb(-scale) if scale else None


def decimal_text(s: str, quantum: decimal.Decimal | None) -> str:
    d = decimal.Decimal(s)
    if quantum is not None and d.is_finite():
        d = d.quantize(quantum)
    return str(d)


def bytea(s: str) -> bytes:
    if not s.startswith("\\x"):
        raise ValueError(f"bytea not in hex format: {s[:20]!r}")
    return bytes.fromhex(s[2:])


def boolean(s: str) -> bool:
    if s in ("t", "true"):
        return True
    if s in ("f", "false"):
        return False
    raise ValueError(f"not a boolean: {s!r}")


def date_days(s: str) -> int:
    return dt.date.fromisoformat(s).toordinal() - _EPOCH_DATE_ORD


def time_us(s: str) -> int:
    t = dt.time.fromisoformat(s)
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


def timestamp_us(s: str) -> int:
    ts = dt.datetime.fromisoformat(s)
    if ts.tzinfo is not None:
        raise ValueError(f"timestamp with an offset: {s!r}")
    return _micros(ts - _EPOCH)


def timestamptz_us(s: str) -> int:
    """The instant (us since the epoch); the session runs in UTC and PostgreSQL keeps
    no zone, so the offset carried is always 0."""
    ts = dt.datetime.fromisoformat(s)
    if ts.tzinfo is None:
        raise ValueError(f"timestamptz without an offset: {s!r}")
    return _micros(ts - _EPOCH_UTC)


def _encoder(ctype: int, scale: int) -> Callable[[str], pb.Value]:
    """text output -> Value, the same as ``common.values.encode`` of the parsed value."""
    V = pb.Value
    if ctype == _INTEGER:
        return lambda s: V(int=int(s))
    if ctype == _DECIMAL:
        quantum = quantum_of(scale)
        return lambda s: V(decimal=decimal_text(s, quantum))
    if ctype == _FLOAT:
        return lambda s: V(float=float(s))
    if ctype == _BYTES:
        return lambda s: V(blob=bytea(s))
    if ctype == _BOOLEAN:
        return lambda s: V(boolean=boolean(s))
    if ctype == _DATE:
        return lambda s: V(date=date_days(s))
    if ctype == _TIME:
        return lambda s: V(time_us=time_us(s))
    if ctype == _TIMESTAMP:
        return lambda s: V(timestamp_us=timestamp_us(s))
    if ctype == _TIMESTAMPTZ:
        return lambda s: V(timestamptz=pb.TimestampTz(utc_us=timestamptz_us(s), offset_s=0))
    if ctype == _JSON:
        return lambda s: V(json=s)
    return lambda s: V(text=s)


def to_value(text: str | None, info: TypeInfo) -> pb.Value:
    """Encode one text-output value (None = NULL) as a txrepl Value of the column's type.

    A value Python cannot hold (``infinity``, BC dates, ``24:00:00``, years past 9999)
    is carried as its text rather than lost.
    """
    if text is None:
        return _NULL
    try:
        return info.encode(text)
    except (ValueError, ArithmeticError, OverflowError):
        return pb.Value(text=text)
