"""The target's node read no more than needed (subscriber/targets/nodewatch.py), and a
small PostgreSQL batch in one round trip (subscriber/targets/postgres/_pipeline.py)."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from common.origin import claim_node
from subscriber.apply import Applier
from subscriber.targets.postgres import PostgresWriter
from subscriber.targets.sqlite import SqliteWriter
from tests.support.entries import INC, ITEMS, entry, ins, schema_op

pytestmark = [pytest.mark.spark]


def _target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, Any]:
    """(writer, a connection of the test's own to the same database)."""
    if kind == "sqlite":
        path = tmp_path / "target.db"
        return SqliteWriter(path), sqlite3.connect(path, isolation_level=None)
    dsn = request.getfixturevalue("pg_db")
    return PostgresWriter(dsn), psycopg.connect(dsn, autocommit=True)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_node_recorded_after_the_writer_found_none_applies_none_of_its_entries(
    spark: Any, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A publisher records the target's node after the subscription found none: the
    next batch still skips that node's own entries (R3) and applies the others'."""
    writer, conn = _target(kind, request, tmp_path)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    applier.apply(2, [entry(ins("items", 1, "before", None))], incarnation=INC)
    assert applier.target_node == ""
    claim_node(conn, kind, "paris", "paris")  # the target's own publisher starts
    own = entry(ins("items", 2, "made on paris", None))
    own.origin = "paris"
    other = entry(ins("items", 3, "made on lyon", None))
    other.origin = "lyon"
    assert applier.apply(3, [own], incarnation=INC).level == 3
    assert applier.apply(4, [other], incarnation=INC).level == 4
    assert applier.target_node == "paris"
    rows = conn.execute("SELECT id, name FROM items ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [(1, "before"), (3, "made on lyon")]
    assert conn.execute("SELECT level FROM txrepl_subscriptions").fetchone()[0] == 4
    writer.close()
    conn.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_node_recorded_meanwhile_is_seen_by_a_batch_that_changes_a_schema(
    spark: Any, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same in one batch that also carries a schema op (PostgreSQL writes it
    outside pipeline mode): the node's own entry is skipped, the other one applied."""
    writer, conn = _target(kind, request, tmp_path)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    assert applier.target_node == ""
    claim_node(conn, kind, "paris", "paris")
    own = entry(ins("items", 2, "made on paris", None))
    own.origin = "paris"
    other = entry(schema_op(ITEMS), ins("items", 3, "made on lyon", None))
    other.origin = "lyon"
    assert applier.apply(2, [own, other], incarnation=INC).level == 3
    rows = conn.execute("SELECT id, name FROM items ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [(3, "made on lyon")]
    assert applier.target_node == "paris"
    writer.close()
    conn.close()


@pytest.mark.postgres
def test_a_small_batch_into_postgresql_waits_on_the_server_once(spark: Any, pg_db: str) -> None:
    """An in-sync batch (a few row changes) into PostgreSQL is one round trip: the
    writer's connection reads one ReadyForQuery for it (libpq's protocol trace), where
    the level read back, the COMMIT and the node lookup each waited for the server."""
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, subscription="s")
    level = applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC).level
    level = applier.apply(level + 1, [entry(ins("items", 1, "warm", None))], incarnation=INC).level
    conn = writer._conn
    assert conn is not None
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        try:
            batch = [entry(ins("items", 2, "two", None)), entry(ins("items", 3, "three", None))]
            level = applier.apply(level + 1, batch, incarnation=INC).level
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        text = trace.read()
    waits = [line for line in text.splitlines() if "\tReadyForQuery" in line]
    assert len(waits) == 1, text
    assert level == 4
    with psycopg.connect(pg_db) as check:
        rows = check.execute("SELECT id FROM items ORDER BY id").fetchall()
    assert rows == [(1,), (2,), (3,)]
    writer.close()
