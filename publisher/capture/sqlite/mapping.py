"""The PostgreSQL type of a SQLite column (``Column.pg_type``): the SQLite side of the
cross-dialect mapping in docs/types.md.

A SQLite column's declared type gives its logical type (``common.values.
parse_declared_type``: the known names, then SQLite's affinity rules) and that gives the
PostgreSQL type a target creates: INTEGER ``bigint``, REAL ``double precision``, TEXT
``text``, BLOB ``bytea``, NUMERIC/DECIMAL ``numeric`` (with the declared precision and
scale), BOOLEAN ``boolean``, DATE ``date``, TIME ``time``, TIMESTAMP/DATETIME
``timestamp``, TIMESTAMPTZ ``timestamptz``, JSON ``json`` (not ``jsonb``: the document's
exact text).  A column without a declared type holds any storage class in any row, so
it has no PostgreSQL type: ``pg_type`` stays empty and a PostgreSQL target refuses the
table when it is added (``subscriber/targets/postgres/_copy.py: pg_type``).
"""

from __future__ import annotations

from common.rpc import txrepl_pb2 as pb

__all__ = ["sqlite_pg_type"]

_PG: dict[int, str] = {
    pb.COLUMN_TYPE_INTEGER: "bigint",
    pb.COLUMN_TYPE_FLOAT: "double precision",
    pb.COLUMN_TYPE_TEXT: "text",
    pb.COLUMN_TYPE_BYTES: "bytea",
    pb.COLUMN_TYPE_BOOLEAN: "boolean",
    pb.COLUMN_TYPE_DATE: "date",
    pb.COLUMN_TYPE_TIME: "time",
    pb.COLUMN_TYPE_TIMESTAMP: "timestamp",
    pb.COLUMN_TYPE_TIMESTAMPTZ: "timestamptz",
    pb.COLUMN_TYPE_JSON: "json",
}


def sqlite_pg_type(ctype: int, precision: int, scale: int) -> str:
    """The PostgreSQL type of a SQLite column of logical type ``ctype`` ("": none)."""
    if ctype == pb.COLUMN_TYPE_DECIMAL:
        return f"numeric({precision},{scale})" if precision else "numeric"
    return _PG.get(ctype, "")
