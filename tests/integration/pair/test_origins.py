"""Origins end to end (issue 24): pairs converge without echoes, chains carry changes on.

Real publishers and subscribers on real databases.  Convergence alone would not show
an echo (a change sent back to its origin and applied again converges too), so each
test also reads the logs: a node's log holds, under its own node as origin, exactly
the row changes made on its source, and under the other node's, no more than that
node made.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.support.harness import wait_until
from tests.support.nodes import Node, caught_up, row_ops_by_origin, sqlite_rows

pytestmark = [pytest.mark.spark]

TABLE = "CREATE TABLE items (id INTEGER PRIMARY KEY, v TEXT, node TEXT)"


def _workload(execute: Callable[[str, tuple[object, ...]], None], name: str, ids: range) -> int:
    """Inserts every id, updates every third, deletes every fifth, one statement per
    transaction with short pauses; returns the row changes made."""
    changes = 0
    for i in ids:
        execute("INSERT INTO items VALUES ({}, {}, {})", (i, f"{name}{i}", name))
        changes += 1
        if i % 3 == 0:
            execute("UPDATE items SET v = v || '+' WHERE id = {}", (i,))
            changes += 1
        if i % 5 == 0:
            execute("DELETE FROM items WHERE id = {}", (i - 2,))  # inserted before
            changes += 1
        time.sleep(0.005)
    return changes


def _sqlite_writer(path: Path) -> Callable[[str, tuple[object, ...]], None]:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)

    def execute(stmt: str, params: tuple[object, ...]) -> None:
        conn.execute(stmt.format(*("?" * len(params))), params)

    return execute


def _pg_writer(dsn: str) -> Callable[[str, tuple[object, ...]], None]:
    conn = psycopg.connect(dsn, autocommit=True)

    def execute(stmt: str, params: tuple[object, ...]) -> None:
        conn.execute(stmt.format(*(["%s"] * len(params))), params)

    return execute


def _concurrently(*jobs: Callable[[], int]) -> list[int]:
    out = [0] * len(jobs)

    def run(n: int) -> None:
        out[n] = jobs[n]()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _started(_: object) -> int:
    return 0


def _settle(nodes: list[Node], rows: Callable[[Node], object], same: list[Node]) -> None:
    """Wait until the nodes ``same`` hold the same rows, every subscription is in sync
    at its head and the heads stay put (a node's capture logs what its subscriber
    applied a moment after); then check that nothing moves any more (no ping-pong)."""
    seen: list[list[int]] = [[]]

    def still() -> bool:
        heads = [n.head() for n in nodes if n.pub is not None]
        steady, seen[0] = heads == seen[0], heads
        return steady and caught_up(nodes) and all(rows(n) == rows(same[0]) for n in same)

    # Steady over more than the PostgreSQL DDL watch's 1 s (_ddlwatch.py): a schema op
    # the apply made on a node is logged by that node's capture within it.
    wait_until(still, 90, "the nodes to converge", interval=1.5)
    time.sleep(2.0)
    assert [n.head() for n in nodes if n.pub is not None] == seen[0], "still replicating"


def _pair(a: Node, b: Node, writers: tuple[Callable[[], int], Callable[[], int]],
          rows: Callable[[Node], object], tail: Node | None = None) -> None:  # fmt: skip
    """Run A ⇄ B (and B → ``tail``, a chain) with A and B writing at once; check
    convergence and the logs."""
    nodes = [a, b] if tail is None else [a, b, tail]
    try:
        a.start_publisher()
        b.start_publisher()
        ups = {a.name: [b], b.name: [a]} | ({tail.name: [b]} if tail else {})
        _concurrently(*[
            lambda n=n: _started(n.start_subscriber(ups[n.name])) for n in nodes
        ])  # fmt: skip
        # The install snapshots applied first (on PostgreSQL one truncates the table):
        # docs/topologies.md, "Setting up a pair".
        wait_until(lambda: caught_up(nodes), 90, "the install snapshots", interval=0.1)
        made_a, made_b = _concurrently(*writers)
        _settle(nodes, rows, nodes)
        expected = rows(a)
        assert isinstance(expected, list)
        assert len(expected) > 20
    finally:
        for n in nodes:
            n.stop()
    log_a, log_b = row_ops_by_origin(a.logged()), row_ops_by_origin(b.logged())
    # Each log holds its own node's changes exactly once, none came back to it...
    assert log_a["a"] == made_a, log_a
    assert log_b["b"] == made_b, log_b
    # ... and the other node's changes as applied here (tagged with their origin, for
    # a chain to carry on), never more of them than that node made.
    assert 0 < log_a["b"] <= made_b, log_a
    assert 0 < log_b["a"] <= made_a, log_b
    assert set(log_a) == set(log_b) == {"a", "b"}


def _sqlite_nodes(tmp_path: Path) -> list[Node]:
    """Nodes a, b and c, each a SQLite file holding the empty ``items`` table."""
    nodes = []
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        db = tmp_path / name / "node.db"
        with sqlite3.connect(db) as conn:
            conn.execute(TABLE)
        nodes.append(Node(name, tmp_path / name, f"sqlite:///{db}", ["items"]))
    return nodes


def test_sqlite_pair_and_chain_converge_without_echo(tmp_path: Path) -> None:
    """SQLite ⇄ SQLite, both sides writing disjoint rows at once, and B published on to
    C (a chain): all three hold the same rows (C has A's through B), and no change was
    replicated back to the node it was made on."""
    a, b, c = _sqlite_nodes(tmp_path)
    writers = (
        lambda: _workload(_sqlite_writer(tmp_path / "a" / "node.db"), "a", range(1, 60, 2)),
        lambda: _workload(_sqlite_writer(tmp_path / "b" / "node.db"), "b", range(2, 60, 2)),
    )
    _pair(a, b, writers, lambda n: sqlite_rows(n.workdir / "node.db", "items"), tail=c)
    assert {r[2] for r in sqlite_rows(c.workdir / "node.db", "items")} == {"a", "b"}


@pytest.mark.postgres
@pytest.mark.parametrize("plugin", ["pgoutput", "wal2json"])
def test_postgres_pair_converges_without_echo(tmp_path: Path, pg_server, plugin: str) -> None:
    """PostgreSQL ⇄ PostgreSQL (replication origins): the same, decoded by pgoutput
    (its Origin message) or wal2json (``include-origin``: the origin's id)."""
    nodes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        dsn = pg_server.create_database()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE.replace("INTEGER", "integer"))
        node = Node(name, tmp_path / name, dsn, ["items"], publisher_extra={"plugin": plugin})
        nodes.append(node)
    a, b = nodes

    def rows(n: Node) -> object:
        with psycopg.connect(n.url) as conn:
            return conn.execute("SELECT * FROM items ORDER BY 1").fetchall()

    writers = (
        lambda: _workload(_pg_writer(a.url), "a", range(1, 60, 2)),
        lambda: _workload(_pg_writer(b.url), "b", range(2, 60, 2)),
    )
    _pair(a, b, writers, rows)


@pytest.mark.postgres
def test_mixed_pair_converges_without_echo(tmp_path: Path, pg_server) -> None:
    """SQLite ⇄ PostgreSQL: each side tags what it applies its own way, and the other
    side's capture reads it back."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    db = tmp_path / "a" / "node.db"
    with sqlite3.connect(db) as conn:
        conn.execute(TABLE)
    dsn = pg_server.create_database()
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(TABLE.replace("INTEGER", "bigint"))
    a = Node("a", tmp_path / "a", f"sqlite:///{db}", ["items"])
    b = Node("b", tmp_path / "b", dsn, ["items"])

    def rows(n: Node) -> object:
        if n is a:
            return sqlite_rows(db, "items")
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT * FROM items ORDER BY 1").fetchall()

    writers = (
        lambda: _workload(_sqlite_writer(db), "a", range(1, 60, 2)),
        lambda: _workload(_pg_writer(dsn), "b", range(2, 60, 2)),
    )
    _pair(a, b, writers, rows)


def test_sqlite_ring_converges_without_loops(tmp_path: Path) -> None:
    """A → B → C → A (SQLite), all three writing disjoint rows at once: every node
    ends with every row, and each change went round once (R3 stops it at the node
    before its origin): each log holds its own node's changes exactly once and the
    others' no more often than they were made."""
    a, b, c = nodes = _sqlite_nodes(tmp_path)

    def rows(n: Node) -> object:
        return sqlite_rows(n.workdir / "node.db", "items")

    try:
        for n in nodes:
            n.start_publisher()
        _concurrently(*[
            lambda n=n, up=up: _started(n.start_subscriber([up]))
            for n, up in ((b, a), (c, b), (a, c))
        ])  # fmt: skip
        wait_until(lambda: caught_up(nodes), 90, "the install snapshots", interval=0.1)
        made = _concurrently(*[
            lambda n=n, k=k: _workload(_sqlite_writer(n.workdir / "node.db"), n.name,
                                       range(1000 * k + 1, 1000 * k + 40, 2))
            for k, n in enumerate(nodes)
        ])  # fmt: skip
        _settle(nodes, rows, nodes)
        final = rows(a)
    finally:
        for n in nodes:
            n.stop()
    assert isinstance(final, list)
    assert {r[2] for r in final} == {"a", "b", "c"}
    for n, own in zip(nodes, made, strict=True):
        log = row_ops_by_origin(n.logged())
        assert log[n.name] == own, (n.name, log)
        for other, theirs in zip(nodes, made, strict=True):
            if other is not n:
                assert 0 < log[other.name] <= theirs, (n.name, log)
