"""Awkward names end to end (issue 19): a schema-qualified table and quoted identifiers
with spaces, dots, quotes, mixed case and reserved words, for tables and columns, from
both sources into both targets, through the real daemons (install snapshot, a backlog
in one batch, live small batches, a key change, deletes) and a reinit's snapshot."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import Pair
from tests.support.phases import backlog_live_reinit

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

# The column names every table has: a key, a reserved word, mixed case, a dot, quotes.
COLUMNS = ['"Order ID"', '"select"', '"Mixed Case"', '"a.b"', '"say ""hi"""']
# (schema on a PostgreSQL source, table): one in a schema with a capital, one whose
# name holds a quote, a dot, a capital (in the default schema)
TABLES = [("Sales", "Order Items"), (None, 'we"ird.T')]
# as the publication config writes them (common/names.py)
CONFIG = {
    "postgres": ["Sales.Order Items", '"we""ird.T"'],
    "sqlite": ["Order Items", '"we""ird.T"'],
}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _source_name(kind: str, schema: str | None, table: str) -> str:
    return f"{_q(schema)}.{_q(table)}" if kind == "postgres" and schema else _q(table)


def _target_name(source: str, target: str, schema: str | None, table: str) -> str:
    """Where the table lands: the source's schema on PostgreSQL (created), and the
    table ``schema.table`` on SQLite (docs/apply.md, "Names")."""
    if source != "postgres" or schema is None:
        return _q(table)
    return f"{_q(schema)}.{_q(table)}" if target == "postgres" else _q(f"{schema}.{table}")


def _ddl(kind: str) -> list[str]:
    key = "bigint" if kind == "postgres" else "INTEGER"
    out = ['CREATE SCHEMA "Sales"'] if kind == "postgres" else []
    for schema, table in TABLES:
        out.append(
            f"CREATE TABLE {_source_name(kind, schema, table)} ({COLUMNS[0]} {key} PRIMARY KEY,"
            f" {COLUMNS[1]} text, {COLUMNS[2]} integer, {COLUMNS[3]} text, {COLUMNS[4]} text)"
        )
    return out


def _work(run: Any, kind: str, start: int, n: int) -> None:
    """``n`` transactions on every table: inserts, updates, a key change, deletes."""
    for i in range(start, start + n):
        stmts: list[tuple[str, tuple[Any, ...]]] = []
        key, _, num, _, _ = COLUMNS
        for schema, table in TABLES:
            t = _source_name(kind, schema, table)
            cols = ", ".join(COLUMNS)
            stmts.append(
                (
                    f"INSERT INTO {t} ({cols}) VALUES (?, ?, ?, ?, ?)",
                    (i, f"sel {i}", i * 7, f"dot {i}", f'he said "{i}"'),
                )
            )
            stmts.append((f"UPDATE {t} SET {num} = {num} + 1 WHERE {key} % 3 = ?", (i % 3,)))
            if i % 4 == 0:
                stmts.append((f"DELETE FROM {t} WHERE {key} = ?", (i - 2,)))
            if i % 5 == 0:  # a key change
                stmts.append((f"UPDATE {t} SET {key} = {key} + 100000 WHERE {key} = ?", (i - 1,)))
        run(stmts)


def _rows(conn: Any, name: str) -> list[tuple[Any, ...]]:
    cols = ", ".join(COLUMNS)
    return [tuple(r) for r in conn.execute(f"SELECT {cols} FROM {name} ORDER BY 1").fetchall()]


JDBC = {
    "spark": {"jars": ["/usr/share/java/postgresql.jar"]},
    "apply": {"jdbc_min_rows": 1, "spark_min_rows": 0},
}


@pytest.mark.parametrize(
    ("source", "target", "subscriber_extra", "plugin"),
    [
        pytest.param("postgres", "postgres", {}, "pgoutput", id="pg-pg-copy"),
        pytest.param("postgres", "postgres", JDBC, "wal2json", id="pg-pg-wal2json-jdbc_staging"),
        pytest.param("postgres", "sqlite", {}, "pgoutput", id="pg-sqlite"),
        pytest.param("sqlite", "postgres", {}, "", id="sqlite-pg"),
        pytest.param("sqlite", "sqlite", {}, "", id="sqlite-sqlite"),
    ],
)
def test_awkward_names_replicate_into_the_same_names(
    tmp_path: Path,
    pg_server: Any,
    spark: Any,
    source: str,
    target: str,
    subscriber_extra: dict[str, Any],
    plugin: str,
) -> None:
    """Tables ``"Sales"."Order Items"`` and ``"we""ird.T"`` with columns ``"Order ID"``,
    ``"select"``, ``"Mixed Case"``, ``"a.b"`` and one named ``say "hi"`` arrive under the same
    names (the schema created on a PostgreSQL target), row for row: rows present at
    install, a backlog in one batch, live small batches (decoded by pgoutput or wal2json,
    staged by COPY or by Spark over JDBC); and a reinit's snapshot loads them into an
    empty target under the same names."""
    if source == "postgres":
        src_url = pg_server.create_database()
        pg = psycopg.connect(src_url, autocommit=True)

        def run(stmts: list[tuple[str, tuple[Any, ...]]]) -> None:
            with pg.transaction():
                for s, p in stmts:
                    pg.execute(s.replace("%", "%%").replace("?", "%s"), p)

        src_conn: Any = pg
    else:
        src_url = f"sqlite:///{tmp_path / 'source.db'}"
        lite = sqlite3.connect(tmp_path / "source.db", isolation_level=None)

        def run(stmts: list[tuple[str, tuple[Any, ...]]]) -> None:
            lite.execute("BEGIN")
            for s, p in stmts:
                lite.execute(s, p)
            lite.execute("COMMIT")

        src_conn = lite
    for stmt in _ddl(source):
        src_conn.execute(stmt)

    made: list[str] = []

    def target_url() -> str:
        made.append(str(pg_server.create_database()) if target == "postgres" else "")
        return made[-1] or f"sqlite:///{tmp_path / f'target{len(made)}.db'}"

    def connect(url: str) -> Any:
        if url.startswith("sqlite"):
            return sqlite3.connect(url.removeprefix("sqlite:///"))
        return psycopg.connect(url, autocommit=True)

    def differences(url: str) -> list[str]:
        out = []
        with connect(url) as dst:  # autocommit: one failed read spoils no other
            for schema, table in TABLES:
                ours = _rows(src_conn, _source_name(source, schema, table))
                try:
                    theirs = _rows(dst, _target_name(source, target, schema, table))
                except (sqlite3.Error, psycopg.Error) as e:
                    out.append(f"{table}: {str(e).strip()}")
                    continue
                if ours != theirs:
                    out.append(f"{table}: source {ours[:3]}... target {theirs[:3]}...")
        return out

    _work(run, source, 0, 10)  # present when the tables are added
    dst_url = target_url()
    pair = Pair(
        tmp_path,
        tables=CONFIG[source],
        source_url=src_url,
        target_url=dst_url,
        publisher_extra={"slot": "txrepl_" + src_url.rsplit("/", 1)[-1], "plugin": plugin}
        if source == "postgres"
        else {},
        subscriber_extra=subscriber_extra,
    )

    try:
        backlog_live_reinit(
            pair, lambda i, n: _work(run, source, i, n), differences, target_url, spark, 10
        )
    finally:
        src_conn.close()
