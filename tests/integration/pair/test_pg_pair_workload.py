"""PostgreSQL ⇄ PostgreSQL and SQLite ⇄ PostgreSQL pairs writing the same rows at once
(issue 24, "Done when"): real publishers and subscribers, the seeded random workload
of tests/support/pair_workload.py on both nodes, A's subscriber down for part of it,
conflicts resolved on both sides by the rows' last writer (``latest_row_wins`` with
``conflict_pair``, as test_pair_conflicts.py does for SQLite ⇄ SQLite).

After the writes stop the pair settles: equal rows, heads that stay put (no
ping-pong), each node's log holding its own changes exactly once (none came back),
and every conflict in both nodes' logs decided by the rule.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import wait_until
from tests.support.nodes import Node, caught_up, row_ops_by_origin
from tests.support.pair_workload import (
    TABLE_PG,
    TABLE_SQLITE,
    Keys,
    Writer,
    concurrently,
    workload,
)

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

UPDATABLE = {
    "conflicts": "python:tests.support.conflict_resolvers:latest_row_wins",
    "conflict_pair": True,
}
TXNS, DOWN_TXNS = 40, 20  # per node, before and while A's subscriber is down


def _node(name: str, kind: str, tmp_path: Path, pg_server: Any) -> Node:
    (tmp_path / name).mkdir()
    if kind == "sqlite":
        db = tmp_path / name / "node.db"
        with sqlite3.connect(db) as conn:
            conn.execute(TABLE_SQLITE)
        url = f"sqlite:///{db}"
    else:
        url = pg_server.create_database()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(TABLE_PG)
    return Node(name, tmp_path / name, url, ["items"], subscription_extra=UPDATABLE)


def _query(n: Node, sql: str) -> list[tuple[Any, ...]]:
    if n.url.startswith("sqlite:///"):
        with sqlite3.connect(n.url.removeprefix("sqlite:///")) as conn:
            conn.row_factory = None
            return [tuple(r) for r in conn.execute(sql).fetchall()]
    with psycopg.connect(n.url) as conn:
        return [tuple(r) for r in conn.execute(sql.encode()).fetchall()]


def _wal_now(n: Node) -> str:
    return (
        ""
        if n.url.startswith("sqlite:///")
        else str(_query(n, "SELECT pg_current_wal_lsn()")[0][0])
    )


def _captured(n: Node, lsn: str) -> bool:
    """Every commit before ``lsn`` logged by the node's publisher (its slot confirmed
    past it); always true on SQLite, whose capture polls the apply's own writes."""
    if not lsn:
        return True
    got = _query(
        n,
        "SELECT bool_and(confirmed_flush_lsn >= '" + lsn + "'::pg_lsn) FROM pg_replication_slots"
        " WHERE database = current_database()",
    )
    return bool(got[0][0])


def _rows(n: Node) -> list[tuple[Any, ...]]:
    return _query(n, "SELECT id, v, ts, node FROM items ORDER BY id")


def _conflicts(n: Node) -> list[dict[str, Any]]:
    cols = ("kind", "decision", "publisher_row", "local_row")
    got = _query(n, f"SELECT {', '.join(cols)} FROM txrepl_conflicts ORDER BY id")
    return [dict(zip(cols, r, strict=True)) for r in got]


def _as_row(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v


def _decided_by_the_rule(c: dict[str, Any]) -> bool:
    pub, loc = _as_row(c["publisher_row"]), _as_row(c["local_row"])
    if loc is None:
        want = "ignore"
    elif pub is None:
        want = "take_publisher"
    else:
        newer = (int(pub["ts"]), pub["node"]) > (int(loc["ts"]), loc["node"])
        want = "take_publisher" if newer else "ignore"
    return bool(c["decision"] == want)


def _differing(nodes: list[Node]) -> list[tuple[object, object]]:
    a, b = ({r[0]: r for r in _rows(n)} for n in nodes)
    return [(a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


@pytest.mark.parametrize("kinds", [("postgres", "postgres"), ("sqlite", "postgres")])
def test_pair_with_postgres_converges_under_concurrent_writes(
    tmp_path: Path, pg_server: Any, kinds: tuple[str, str]
) -> None:
    """Both nodes writing the same keys at once, then on while A's subscriber is down:
    equal rows, every conflict logged and decided by the rule, no echo."""
    nodes = [_node(name, kind, tmp_path, pg_server) for name, kind in zip("ab", kinds, strict=True)]
    a, b = nodes
    keys = Keys()
    writers: list[Writer] = []
    try:
        a.start_publisher()
        b.start_publisher()
        concurrently(lambda: a.start_subscriber([b]), lambda: b.start_subscriber([a]))
        wait_until(lambda: caught_up(nodes), 90, "the install snapshots", interval=0.1)
        writers = [Writer(n.url) for n in nodes]
        made = concurrently(
            lambda: workload(writers[0], "a", 240, keys, TXNS),
            lambda: workload(writers[1], "b", 241, keys, TXNS),
        )
        assert a.sub is not None
        a.sub.stop()
        more = concurrently(
            lambda: workload(writers[0], "a", 242, keys, DOWN_TXNS),
            lambda: workload(writers[1], "b", 243, keys, DOWN_TXNS),
        )
        made = [x + y for x, y in zip(made, more, strict=True)]
        a.start_subscriber([b])
        seen: list[list[int]] = [[]]
        prev: dict[str, Any] = {"ok": False, "marks": []}

        def settled() -> bool:
            # A PostgreSQL node's capture of the apply's last commit may trail the
            # commit (caught up, equal rows, the entry not yet logged): settled also
            # needs every slot confirmed past a WAL position read after the previous
            # poll found the pair caught up with equal rows (every apply committed
            # before it), and the heads, read after that, unchanged since.
            captured = prev["ok"] and all(map(_captured, nodes, prev["marks"]))
            heads = [n.head() for n in nodes]
            steady, seen[0] = heads == seen[0], heads
            ok = caught_up(nodes) and _rows(a) == _rows(b)
            prev["ok"], prev["marks"] = ok, [_wal_now(n) for n in nodes]
            return bool(captured and steady and ok)

        try:
            wait_until(settled, 60, "the pair to converge", interval=0.3)
        except TimeoutError:
            raise AssertionError(f"the pair did not converge: {_differing(nodes)}") from None
        time.sleep(1.0)  # a settled pair stays settled: nothing travels back and forth
        assert [n.head() for n in nodes] == seen[0], "still replicating"
        final = _rows(a)
        logged = [_conflicts(n) for n in nodes]
    finally:
        for w in writers:
            w.close()
        for n in nodes:
            n.stop()
    assert {r[3] for r in final} == {"a", "b"}, final
    # No change came back to its origin: each log holds its own node's changes once.
    log_a, log_b = row_ops_by_origin(a.logged()), row_ops_by_origin(b.logged())
    assert (log_a["a"], log_b["b"]) == tuple(made), (log_a, log_b, made)
    assert 0 < log_a["b"] <= made[1], log_a
    assert 0 < log_b["a"] <= made[0], log_b
    assert all(logged), logged
    kinds_seen = {c["kind"] for cs in logged for c in cs}
    assert "update_changed" in kinds_seen, kinds_seen
    wrong = [c for cs in logged for c in cs if not _decided_by_the_rule(c)]
    assert not wrong, wrong
