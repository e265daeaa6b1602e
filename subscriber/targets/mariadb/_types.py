"""Logical column types -> MariaDB columns, apply columns -> PyMySQL parameters.

===========  ==========================  ==========================================
ColumnType   MariaDB column              value written
===========  ==========================  ==========================================
INTEGER      BIGINT                      integer
DECIMAL      DECIMAL(p,s) if p <= 65     the decimal (exact within p,s)
             and s <= 38, else LONGTEXT  positional decimal text (as SQLite keeps it)
FLOAT        DOUBLE                      double; NaN and +-Inf refused (no such value)
TEXT         LONGTEXT                    text (utf8mb4, binary collation, no padding)
BYTES        LONGBLOB                    bytes
BOOLEAN      BOOLEAN (TINYINT(1))        0 / 1
DATE         DATE                        date
TIME         TIME(6)                     time
TIMESTAMP    DATETIME(6)                 naive timestamp
TIMESTAMPTZ  DATETIME(6)                 the instant in UTC (the offset is not kept)
JSON         LONGTEXT                    the document's exact text
other        LONGTEXT                    PostgreSQL's text output
===========  ==========================  ==========================================

A key column cannot be a LONGTEXT / LONGBLOB (InnoDB indexes only a prefix of
those): there TEXT, JSON, other and text decimals are ``VARCHAR(255)`` and BYTES
``VARBINARY(255)`` (a longer key value is refused by the server when its row comes).
Text columns use ``utf8mb4_nopad_bin``: keys compare byte for byte as on the source
(``'a'`` and ``'A'``, ``'a'`` and ``'a '`` are different keys).

Refused when the table is added (:func:`check_schema`, the column named): a SQLite
column without a declared type (its rows may hold any storage class), and a table or
column name MariaDB cannot hold (longer than 64 characters, or ending with a space).
Tables are flat, as on SQLite: ``schema.name`` is one table of that name in the
target database (a MariaDB schema is a database, outside the one the URL names).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math

import pyarrow as pa

from common import values
from common.names import parse_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import SchemaError, WriterError
from subscriber.apply.writer import column_of, python_values

__all__ = ["check_schema", "column_sql", "column_values", "python_value", "quote", "quote_table"]

T = pb.ColumnType

_TYPES: dict[int, str] = {
    T.COLUMN_TYPE_INTEGER: "BIGINT",
    T.COLUMN_TYPE_FLOAT: "DOUBLE",
    T.COLUMN_TYPE_TEXT: "LONGTEXT",
    T.COLUMN_TYPE_BYTES: "LONGBLOB",
    T.COLUMN_TYPE_BOOLEAN: "BOOLEAN",
    T.COLUMN_TYPE_DATE: "DATE",
    T.COLUMN_TYPE_TIME: "TIME(6)",
    T.COLUMN_TYPE_TIMESTAMP: "DATETIME(6)",
    T.COLUMN_TYPE_TIMESTAMPTZ: "DATETIME(6)",
    T.COLUMN_TYPE_JSON: "LONGTEXT",
}
_KEY_TYPES = {"LONGTEXT": "VARCHAR(255)", "LONGBLOB": "VARBINARY(255)"}
_COLLATE = " CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
_MAX_NAME = 64

quote = quote_ident  # the session runs with ANSI_QUOTES (_conn.py)


def quote_table(table: str) -> str:
    """The MariaDB table of wire table ``table``, quoted: one flat name (module docstring)."""
    return quote_ident(parse_table(table).flat)


def _decimal_type(column: pb.Column) -> str | None:
    """DECIMAL(p,s) when MariaDB can hold it exactly, else None (kept as text)."""
    if 0 < column.precision <= 65 and column.scale <= min(38, column.precision):
        return f"DECIMAL({column.precision},{column.scale})"
    return None


def _refuse(schema: pb.TableSchema, column: str, why: str) -> SchemaError:
    return SchemaError(
        f"table {schema.table!r}, column {column!r}: {why} (docs/types.md)", table=schema.table
    )


def check_schema(schema: pb.TableSchema) -> None:
    """Refuse (SchemaError naming table and column) what a MariaDB target cannot hold."""
    flat = parse_table(schema.table).flat
    if len(flat) > _MAX_NAME or flat.endswith(" "):
        raise SchemaError(
            f"table {schema.table!r}: MariaDB table names are at most {_MAX_NAME} characters"
            " and do not end with a space; rename it on the source or leave it out of the"
            " publication (docs/types.md)",
            table=schema.table,
        )
    for c in schema.columns:
        if len(c.name) > _MAX_NAME or c.name.endswith(" ") or not c.name:
            raise _refuse(
                schema,
                c.name,
                f"MariaDB column names are 1 to {_MAX_NAME} characters and do not end with a"
                " space; rename the column on the source or leave the table out of the"
                " publication",
            )
        if schema.source_dialect == "sqlite" and c.type == T.COLUMN_TYPE_UNSPECIFIED:
            raise _refuse(
                schema,
                c.name,
                "a SQLite column without a declared type has no MariaDB type (its rows may"
                " hold any storage class); declare its type on the source (TEXT, INTEGER,"
                " BLOB, ...) or leave the table out of the publication",
            )


def column_sql(column: pb.Column, *, key: bool) -> str:
    """The MariaDB type of a column (module docstring), with its collation."""
    spelled = (_decimal_type(column) if column.type == T.COLUMN_TYPE_DECIMAL else None) or (
        _TYPES.get(column.type, "LONGTEXT")
    )
    if key:
        spelled = _KEY_TYPES.get(spelled, spelled)
    if spelled in ("LONGTEXT", "VARCHAR(255)"):
        spelled += _COLLATE
    return spelled


def _positional(text: str) -> str:
    return format(decimal.Decimal(text), "f") if "E" in text else text


def _utc(v: dt.datetime) -> dt.datetime:
    return v if v.tzinfo is None else v.astimezone(dt.UTC).replace(tzinfo=None)


def python_value(v: object, where: str) -> object:
    """A ``common.values`` Python value as PyMySQL binds it for this target."""
    if isinstance(v, values.RawText):
        raise WriterError(f"{where}: TEXT that is not UTF-8 cannot be stored in MariaDB")
    if isinstance(v, float) and not math.isfinite(v):
        raise WriterError(f"{where}: MariaDB has no {v!r} in a DOUBLE column (docs/types.md)")
    if isinstance(v, decimal.Decimal):
        return _positional(str(v))
    if isinstance(v, dt.datetime):
        return _utc(v)
    return v


def column_values(table: pa.Table, index: int, schema: pb.TableSchema) -> list[object]:
    """The ``index``-th schema column of an apply table as PyMySQL parameters."""
    column = schema.columns[index]
    col, variant = column_of(table, index)
    t = column.type
    where = f"table {schema.table!r}, column {column.name!r}"
    if not variant and t in (T.COLUMN_TYPE_INTEGER, T.COLUMN_TYPE_TEXT, T.COLUMN_TYPE_JSON):
        out: list[object] = col.to_pylist()
        return out
    if not variant and t in (T.COLUMN_TYPE_BYTES, T.COLUMN_TYPE_DATE):
        out = col.to_pylist()
        return out
    if not variant and t == T.COLUMN_TYPE_DECIMAL:
        return [None if s is None else _positional(s) for s in col.to_pylist()]
    if not variant and t == T.COLUMN_TYPE_BOOLEAN:
        return [None if b is None else int(b) for b in col.to_pylist()]
    return [
        None if v is None else python_value(v, where) for v in python_values(col, column, variant)
    ]
