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
from common.values import encode

__all__ = [
    "SESSION_GUCS",
    "TypeInfo",
    "builtin_type",
    "numeric_typmod",
    "parse_text",
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
    """The logical type of one column: its ColumnType, precision, scale and parser."""

    __slots__ = ("ctype", "parse", "precision", "scale", "source_type")

    def __init__(self, ctype: int, precision: int, scale: int, source_type: str) -> None:
        self.ctype = ctype
        self.precision = precision
        self.scale = scale
        self.source_type = source_type
        self.parse: Callable[[str], object] = _PARSERS.get(ctype, _text)

    def column(self, name: str, nullable: bool) -> pb.Column:
        return pb.Column(
            name=name,
            type=self.ctype,  # type: ignore[arg-type]
            precision=self.precision,
            scale=self.scale,
            nullable=nullable,
            source_type=self.source_type,
        )


def _text(s: str) -> object:
    return s


def _bytea(s: str) -> object:
    if s.startswith("\\x"):
        return bytes.fromhex(s[2:])
    raise ValueError(f"bytea not in hex format: {s[:20]!r}")


def _bool(s: str) -> object:
    if s in ("t", "true"):
        return True
    if s in ("f", "false"):
        return False
    raise ValueError(f"not a boolean: {s!r}")


def _date(s: str) -> object:
    return dt.date.fromisoformat(s)


def _time(s: str) -> object:
    return dt.time.fromisoformat(s)


def _timestamp(s: str) -> object:
    return dt.datetime.fromisoformat(s)


def _timestamptz(s: str) -> object:
    ts = dt.datetime.fromisoformat(s)
    if ts.tzinfo is None:
        raise ValueError(f"timestamptz without an offset: {s!r}")
    return ts.astimezone(dt.UTC)


_PARSERS: Final[dict[int, Callable[[str], object]]] = {
    T.COLUMN_TYPE_INTEGER: int,
    T.COLUMN_TYPE_DECIMAL: decimal.Decimal,
    T.COLUMN_TYPE_FLOAT: float,
    T.COLUMN_TYPE_BYTES: _bytea,
    T.COLUMN_TYPE_BOOLEAN: _bool,
    T.COLUMN_TYPE_DATE: _date,
    T.COLUMN_TYPE_TIME: _time,
    T.COLUMN_TYPE_TIMESTAMP: _timestamp,
    T.COLUMN_TYPE_TIMESTAMPTZ: _timestamptz,
}


def parse_text(text: str, info: TypeInfo) -> object:
    """The Python value of a text-output ``text``; the text itself when Python cannot hold it."""
    try:
        return info.parse(text)
    except (ValueError, ArithmeticError):
        return text


def to_value(text: str | None, info: TypeInfo) -> pb.Value:
    """Encode one text-output value (None = NULL) as a txrepl Value of the column's type."""
    if text is None:
        return encode(None)
    return encode(parse_text(text, info), info.ctype, info.scale)
