"""Table names on a PostgreSQL target: the wire's ``schema.name`` (common/names.py)
becomes the table ``name`` in schema ``schema``, created if missing; a bare ``name``
stays unqualified (the connection's ``search_path`` finds it, as before)."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from common.names import parse_table

__all__ = ["T", "create_schema", "table_sql"]


def table_sql(table: str) -> sql.Identifier:
    """The SQL name of wire table ``table``: ``"schema"."name"`` or ``"name"``."""
    ref = parse_table(table)
    return sql.Identifier(ref.name) if ref.schema is None else sql.Identifier(ref.schema, ref.name)


def create_schema(cur: Any, table: str) -> None:
    """Create the schema of wire table ``table`` if it names one that is missing."""
    schema = parse_table(table).schema
    if schema is not None:
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


T = table_sql  # short, as the writer's statements use it next to ``Q = sql.Identifier``
