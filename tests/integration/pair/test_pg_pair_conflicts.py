"""Pairs with a PostgreSQL node and conflicts on (issue 24): real publishers and
subscribers on real databases.

``republish`` on PostgreSQL: the resolver's row is written after the batch, in a
transaction with no replication origin (subscriber/targets/conflicts/_republish.py),
so this node's capture logs it as its own change and the originator gets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import wait_until
from tests.support.nodes import Node, caught_up, row_ops_by_origin

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

TABLE = "CREATE TABLE items (id integer PRIMARY KEY, v text, ts bigint, node text)"
MERGE = {"conflicts": "python:tests.support.conflict_resolvers:merge_republish"}


def _pg_node(name: str, tmp_path: Path, pg_server: Any, extra: dict[str, Any]) -> Node:
    (tmp_path / name).mkdir()
    dsn = pg_server.create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE)
    return Node(name, tmp_path / name, dsn, ["items"], subscription_extra=extra)


def _pg_rows(n: Node) -> list[tuple[object, ...]]:
    with psycopg.connect(n.url) as conn:
        return conn.execute("SELECT id, v FROM items ORDER BY 1").fetchall()


def _pg_exec(n: Node, stmt: str) -> None:
    with psycopg.connect(n.url, autocommit=True) as conn:
        conn.execute(stmt.encode())


def test_postgres_republish_reaches_the_originator(tmp_path: Path, pg_server: Any) -> None:
    """B's subscription resolves a conflict on A's update by republishing a merged
    row; A, which never had that row, gets it from B (on PostgreSQL the apply's
    replication origin used to tag it as A's own change, and A never saw it)."""
    a = _pg_node("a", tmp_path, pg_server, {})
    b = _pg_node("b", tmp_path, pg_server, MERGE)
    nodes = [a, b]
    try:
        a.start_publisher()
        b.start_publisher()
        a.start_subscriber([b])
        b.start_subscriber([a])
        wait_until(lambda: caught_up(nodes), 90, "the install snapshots", interval=0.1)
        _pg_exec(a, "INSERT INTO items VALUES (1, 'x', 0, 'a')")
        wait_until(lambda: _pg_rows(b) == [(1, "x")], 30, "B to get row 1")
        assert b.sub is not None
        b.sub.stop()  # B's update and A's cross while B's subscriber is down
        _pg_exec(b, "UPDATE items SET v = 'b', node = 'b' WHERE id = 1")
        wait_until(lambda: _pg_rows(a) == [(1, "b")], 30, "A to get B's update")
        _pg_exec(a, "UPDATE items SET v = 'a', node = 'a' WHERE id = 1")
        b.start_subscriber([a])  # A's update meets B's: update_changed, republished
        wait_until(lambda: _pg_rows(b) == [(1, "a+b")], 60, "B's conflict", interval=0.2)
        try:
            wait_until(
                lambda: caught_up(nodes) and _pg_rows(a) == [(1, "a+b")], 60, "A", interval=0.2
            )
        except TimeoutError:
            raise AssertionError(
                f"A never got B's republished row: A holds {_pg_rows(a)}"
            ) from None
        with psycopg.connect(b.url) as conn:
            got = conn.execute("SELECT kind, decision FROM txrepl_conflicts").fetchall()
            left = conn.execute("SELECT count(*) FROM txrepl_republish").fetchone()
        assert got == [("update_changed", "republish")]
        assert left == (0,)
    finally:
        for n in nodes:
            n.stop()
    # A's own changes are in its log once (none came back), B's log holds the
    # republished row as B's own change.
    log_a, log_b = row_ops_by_origin(a.logged()), row_ops_by_origin(b.logged())
    assert log_a["a"] == 2, log_a
    assert log_b["b"] == 2, log_b  # B's update and the republished row
