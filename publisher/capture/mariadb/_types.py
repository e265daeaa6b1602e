"""MariaDB columns -> txrepl logical types, and MariaDB values -> wire values.

A table's shape is read from ``information_schema.columns`` (current catalog); its
values come from two places that must agree value for value: row images in the
binary log (decoded by ``pymysqlreplication``) and ``SELECT`` in a snapshot
(PyMySQL, session ``time_zone = '+00:00'``).

=============================================  ===========  ==============================
MariaDB (``DATA_TYPE``)                        ColumnType   value
=============================================  ===========  ==============================
tinyint, smallint, mediumint, int, bigint,     INTEGER      int (BOOLEAN is tinyint(1): an
year; int unsigned                                          integer, it may hold 5)
bigint unsigned                                DECIMAL(20)  Decimal (beyond a signed 64-bit)
decimal(p,s)                                   DECIMAL      Decimal, exact
double                                         FLOAT        float
float (single precision)                       FLOAT        the single's exact value as a
                                                            double (the snapshot reads
                                                            ``CAST(c AS DOUBLE)``, as the
                                                            binary log holds it)
char, varchar, *text, enum                     TEXT         str (JSON is a longtext here:
                                                            its exact text)
binary, varbinary, *blob                       BYTES        bytes (binary(n) with its pad:
                                                            the log drops trailing zeros)
date                                           DATE         date
datetime                                       TIMESTAMP    naive datetime
timestamp                                      TIMESTAMPTZ  the instant, UTC
time                                           TIME         time of day; a value outside
                                                            00:00-24:00 (TIME is a duration
                                                            on MariaDB) travels as text and
                                                            a target refuses it
=============================================  ===========  ==============================

Refused when the table is added (:func:`refusal`, naming table, column and type): bit
(the binary log and a query give it in different forms), set (the binary log gives
an unordered set), the spatial types, and MariaDB's own uuid / inet4 / inet6 (stored
as binary, shown as text) -- there is no exact carriage for them yet.  Zero dates
(``'0000-00-00'``, allowed without ``NO_ZERO_DATE``) have no Python value: they
travel as NULL (docs/types.md).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from common.rpc import txrepl_pb2 as pb
from common.values import encode

__all__ = ["ColumnInfo", "TableShape", "column_of", "converter", "refusal"]

T = pb.ColumnType

_INTEGERS = {"tinyint", "smallint", "mediumint", "int", "bigint", "year"}
_TEXTS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum"}
_BYTES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_SIMPLE = {
    "double": T.COLUMN_TYPE_FLOAT,
    "float": T.COLUMN_TYPE_FLOAT,
    "date": T.COLUMN_TYPE_DATE,
    "datetime": T.COLUMN_TYPE_TIMESTAMP,
    "timestamp": T.COLUMN_TYPE_TIMESTAMPTZ,
    "time": T.COLUMN_TYPE_TIME,
}
_WHY = {
    "bit": "the binary log and a query give BIT values in different forms",
    "set": "the binary log gives a SET value unordered",
    "uuid": "MariaDB's uuid type is stored as binary and shown as text",
    "inet4": "MariaDB's inet4 type is stored as binary and shown as text",
    "inet6": "MariaDB's inet6 type is stored as binary and shown as text",
}
_SPATIAL = {
    "geometry",
    "point",
    "linestring",
    "polygon",
    "multipoint",
    "multilinestring",
    "multipolygon",
    "geometrycollection",
}
_DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class ColumnInfo:
    """One row of ``information_schema.columns``."""

    name: str
    data_type: str  # DATA_TYPE, lower case
    column_type: str  # COLUMN_TYPE, e.g. "bigint(20) unsigned"
    nullable: bool
    precision: int
    scale: int


def refusal(table: str, c: ColumnInfo) -> str | None:
    """Why column ``c`` of ``table`` cannot be carried exactly (one line), else None."""
    why = _WHY.get(c.data_type)
    if why is None and c.data_type in _SPATIAL:
        why = "spatial values have no txrepl type"
    if why is None and column_of(c) is None:
        why = "it has no txrepl type"
    if why is None:
        return None
    return (
        f"table {table!r} column {c.name!r} has type {c.column_type}, which txrepl cannot"
        f" carry from MariaDB: {why} (docs/types.md); change the column's type or leave"
        " the table out of the publication"
    )


def column_of(c: ColumnInfo) -> pb.Column | None:
    """The wire column of ``c``; None when it has no logical type (refused)."""
    col = pb.Column(name=c.name, nullable=c.nullable, source_type=c.column_type)
    t = c.data_type
    if t in _INTEGERS:
        if t == "bigint" and "unsigned" in c.column_type:
            col.type, col.precision, col.scale = T.COLUMN_TYPE_DECIMAL, 20, 0
        else:
            col.type = T.COLUMN_TYPE_INTEGER
    elif t == "decimal":
        col.type, col.precision, col.scale = T.COLUMN_TYPE_DECIMAL, c.precision, c.scale
    elif t in _TEXTS:
        col.type = T.COLUMN_TYPE_TEXT
    elif t in _BYTES:
        col.type = T.COLUMN_TYPE_BYTES
    elif t in _SIMPLE and t not in _WHY:
        col.type = _SIMPLE[t]
    else:
        return None
    return col


@dataclass(frozen=True)
class TableShape:
    """A table as capture reads it: its wire schema and one value converter per column."""

    schema: pb.TableSchema
    infos: tuple[ColumnInfo, ...]
    convert: tuple[Callable[[object], pb.Value], ...]
    key_idx: tuple[int, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.infos]

    @classmethod
    def of(cls, table: str, infos: Sequence[ColumnInfo], key: Sequence[str]) -> TableShape:
        schema = pb.TableSchema(table=table, source_dialect="mariadb")
        convert = []
        for c in infos:
            col = column_of(c)
            if col is None:  # install refuses it first; a later ALTER may bring one
                raise ValueError(refusal(table, c))
            schema.columns.append(col)
            convert.append(converter(col, _binary_width(c)))
        schema.primary_key.extend(key)
        names = [c.name for c in infos]
        return cls(schema, tuple(infos), tuple(convert), tuple(names.index(k) for k in key))

    def select_list(self, quote: Callable[[str], str]) -> str:
        """The snapshot's SELECT list: single-precision floats read as the log holds them."""
        return ", ".join(
            f"CAST({quote(c.name)} AS DOUBLE)" if c.data_type == "float" else quote(c.name)
            for c in self.infos
        )


def _binary_width(c: ColumnInfo) -> int:
    """n of a BINARY(n) column, else 0."""
    if c.data_type != "binary":
        return 0
    return int(c.column_type.partition("(")[2].rstrip(")") or 1)


def converter(col: pb.Column, width: int = 0) -> Callable[[object], pb.Value]:
    """``convert(v)``: the wire value of a binary-log or snapshot value of ``col``.

    ``width``: of a BINARY(n) column, whose trailing zero bytes the binary log drops
    (a query gives them): put back.
    """
    ctype, scale = int(col.type), col.scale
    if ctype == T.COLUMN_TYPE_BYTES:

        def raw(v: object) -> pb.Value:
            if isinstance(v, str):  # the library gives an empty binary value as ""
                v = v.encode("utf-8", "surrogateescape")
            if isinstance(v, bytes) and len(v) < width:
                v = v.ljust(width, b"\0")
            return encode(v, ctype, scale)

        return raw
    if ctype == T.COLUMN_TYPE_TIME:

        def time_of(v: object) -> pb.Value:
            if isinstance(v, dt.timedelta):
                if dt.timedelta(0) <= v < _DAY:
                    secs = int(v.total_seconds())
                    v = dt.time(secs // 3600, secs // 60 % 60, secs % 60, v.microseconds)
                else:
                    return encode(_duration_text(v), T.COLUMN_TYPE_TEXT)
            return encode(v, ctype, scale)

        return time_of
    if ctype == T.COLUMN_TYPE_TIMESTAMPTZ:

        def instant(v: object) -> pb.Value:
            if isinstance(v, dt.datetime) and v.tzinfo is None:
                v = v.replace(tzinfo=dt.UTC)  # both readers give UTC (module docstring)
            return encode(v, ctype, scale)

        return instant
    if ctype == T.COLUMN_TYPE_DECIMAL:

        def exact(v: object) -> pb.Value:
            if isinstance(v, int) and not isinstance(v, bool):
                v = decimal.Decimal(v)
            return encode(v, ctype, scale)

        return exact
    if ctype == T.COLUMN_TYPE_TEXT:

        def text(v: object) -> pb.Value:
            if isinstance(v, bytes):  # a text column in a binary charset
                v = v.decode("utf-8", "surrogateescape")
            return encode(v, ctype, scale)

        return text
    return lambda v: encode(v, ctype, scale)


def _duration_text(v: dt.timedelta) -> str:
    sign = "-" if v < dt.timedelta(0) else ""
    us = abs(v) // dt.timedelta(microseconds=1)
    secs, micro = divmod(us, 1_000_000)
    text = f"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return f"{text}.{micro:06d}" if micro else text
