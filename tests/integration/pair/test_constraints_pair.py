"""Targets with UNIQUE, CHECK and foreign key constraints, end to end (issue 20).

Real daemons on real databases: a SQLite source into a SQLite target, a PostgreSQL
source into a PostgreSQL target, the same tables and constraints created on both
sides.  What the source accepted, the target takes: value swaps and cycles in
unique columns (within one transaction and across several), a value freed by one
key and taken by another, key changes, parent/child inserts, re-parenting, deletes
children-first and by ON DELETE CASCADE / SET NULL.  Either as it comes (running)
or all in one batch (paused: the subscriber started after the changes), and under
SIGKILLs of the subscriber in the middle of such batches.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from tests.support.harness import Pair, wait_until

pytestmark = pytest.mark.spark

DDL = [
    "CREATE TABLE users (id integer PRIMARY KEY, email text NOT NULL UNIQUE, nick text,"
    " CHECK (length(email) > 0))",
    "CREATE UNIQUE INDEX users_nick ON users (nick)",
    "CREATE TABLE parent (id integer PRIMARY KEY, name text NOT NULL UNIQUE)",
    "CREATE TABLE child (id integer PRIMARY KEY,"
    " p integer REFERENCES parent (id) ON DELETE CASCADE,"
    " q integer REFERENCES parent (id) ON DELETE SET NULL, v text)",
]
TABLES = {"users": "id, email, nick", "parent": "id, name", "child": "id, p, q, v"}


def _email(i: int, value: str) -> str:
    return f"UPDATE users SET email = '{value}' WHERE id = {i}"


def _nick(i: int, value: str) -> str:
    return f"UPDATE users SET nick = '{value}' WHERE id = {i}"


# Each inner list is one source transaction.  SETUP is applied first, on its own.
SETUP: list[list[str]] = [
    ["INSERT INTO users VALUES (1, 'a', 'na'), (2, 'b', 'nb'), (3, 'c', 'nc'), (4, 'd', 'nd')"],
    [
        "INSERT INTO parent VALUES (1, 'p1'), (2, 'p2')",
        "INSERT INTO child VALUES (1, 1, 2, 'c1'), (2, 2, 1, 'c2'), (3, 1, 1, 'c3')",
    ],
]
TRANSACTIONS: list[list[str]] = [
    # A swap through a temporary value in one transaction: emails 1:b 2:a.
    [_email(1, "tmp"), _email(2, "a"), _email(1, "b")],
    # A cycle of three in one transaction: nicks 1:nb 2:nc 3:na.
    [_nick(1, "x"), _nick(3, "na"), _nick(2, "nc"), _nick(1, "nb")],
    # A swap across three transactions: emails 3:d 4:c.
    [_email(3, "tmp")],
    [_email(4, "c")],
    [_email(3, "d")],
    # A cycle of three across four transactions: emails 1:d 2:b 3:a.
    [_email(1, "tmp")],
    [_email(2, "b")],
    [_email(3, "a")],
    [_email(1, "d")],
    # A value freed by a delete and taken by a new key; a key change; the old key reused
    # with the value the moved row gives up.
    ["DELETE FROM users WHERE id = 4", "INSERT INTO users VALUES (5, 'c', 'nd')"],
    ["UPDATE users SET id = 6 WHERE id = 5"],
    [_email(6, "f"), "INSERT INTO users VALUES (5, 'c', 'n5')"],
    # Foreign keys: a new parent and its child, re-parenting, a cascade (and SET NULL).
    ["INSERT INTO parent VALUES (3, 'p3')", "INSERT INTO child VALUES (4, 3, 3, 'c4')"],
    ["UPDATE child SET p = 3 WHERE id = 1"],
    ["DELETE FROM parent WHERE id = 1"],
    # A unique swap on the parent, then children first, then their parent.
    [
        "UPDATE parent SET name = 'tmp' WHERE id = 2",
        "UPDATE parent SET name = 'p2' WHERE id = 3",
        "UPDATE parent SET name = 'p3' WHERE id = 2",
    ],
    ["DELETE FROM child WHERE id = 4", "DELETE FROM parent WHERE id = 3"],
    # A parent inserted again, a child of it, then both deleted parent-first (cascade).
    ["INSERT INTO parent VALUES (1, 'p1')", "INSERT INTO child VALUES (5, 1, 2, 'c5')"],
    [_email(2, "tmp"), "DELETE FROM parent WHERE id = 1", _email(6, "b"), _email(2, "f")],
]


def _run(conn: Any, transactions: list[list[str]]) -> None:
    for statements in transactions:
        conn.execute("BEGIN")
        for s in statements:
            conn.execute(s)
        conn.execute("COMMIT")


def _rows(conn: Any) -> dict[str, list[tuple[Any, ...]]]:
    return {
        t: [tuple(r) for r in conn.execute(f"SELECT {cols} FROM {t} ORDER BY id").fetchall()]
        for t, cols in TABLES.items()
    }


class Side:
    """The source and target of one dialect, their connections and the pair."""

    def __init__(self, tmp_path: Path, dialect: str, pg_server: Any = None) -> None:
        self.dialect = dialect
        if dialect == "sqlite":
            self.pair = Pair(tmp_path, tables=list(TABLES))
            self.source: Any = sqlite3.connect(
                str(self.pair.source_path), isolation_level=None, timeout=30
            )
            self.source.execute("PRAGMA journal_mode=WAL")
            self.source.execute("PRAGMA foreign_keys=ON")  # the application's cascades
            self.target: Callable[[], Any] = lambda: sqlite3.connect(
                str(self.pair.target_path), timeout=30
            )
        else:
            import psycopg

            src_dsn = pg_server.create_database()
            dst_dsn = pg_server.create_database()
            self.pair = Pair(
                tmp_path,
                tables=list(TABLES),
                source_url=src_dsn,
                target_url=dst_dsn,
                publisher_extra={"slot": "txrepl_" + dst_dsn.rsplit("/", 1)[-1]},
            )
            self.source = psycopg.connect(src_dsn, autocommit=True)
            self.target = lambda: psycopg.connect(dst_dsn, autocommit=True)
        for s in DDL:
            self.source.execute(s)
        dst = self.target()
        for s in DDL:
            dst.execute(s)
        dst.commit()
        dst.close()

    def target_rows(self) -> dict[str, list[tuple[Any, ...]]]:
        dst = self.target()
        try:
            return _rows(dst)
        finally:
            dst.close()

    def settle(self, timeout: float = 120) -> None:
        """Wait until the target equals the source (or the subscription errs); assert."""
        want = _rows(self.source)
        seen: dict[str, Any] = {}

        def done() -> bool:
            st = self.pair.status()
            if st.state == "error":
                return True
            try:
                seen["rows"] = self.target_rows()
            except Exception as exc:  # the target may be mid-change
                seen["rows"] = exc
            return bool(
                seen["rows"] == want and st.level == self.pair.head() and st.state == "in_sync"
            )

        try:
            wait_until(done, timeout, "the target to equal the source", interval=0.3)
        except TimeoutError:
            pass
        st = self.pair.status()
        assert st.state == "in_sync", f"state {st.state}, last error: {st.last_error}"
        assert seen["rows"] == want

    def close(self) -> None:
        self.pair.stop()
        self.source.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def side(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    pg = None
    if request.param == "postgresql":
        request.applymarker(pytest.mark.postgres)
        pg = request.getfixturevalue("pg_server")
    s = Side(tmp_path, request.param, pg)
    yield s
    s.close()


def _control(pair: Pair, method: str) -> None:
    """``Pause`` or ``Resume`` the subscription through the subscriber's control service."""
    assert pair.sub is not None
    with grpc.insecure_channel(pair.sub.address) as ch:
        getattr(rpc.SubscriberControlStub(ch), method)(pb.SubscriptionRequest(), timeout=10)


@pytest.mark.parametrize("mode", ["running", "paused"])
def test_swaps_cycles_and_foreign_keys_apply(side: Side, mode: str) -> None:
    """Unique swaps and cycles (in one transaction and across several), key changes,
    parent/child inserts, re-parenting, children-first deletes and cascades, on rows
    the target already holds: the subscription stays in sync and the target equals
    the source, whether each transaction comes on its own (running) or all land in
    one batch (paused, then resumed)."""
    pair = side.pair
    pair.start_publisher()
    pair.start_subscriber()
    _run(side.source, SETUP)
    side.settle()
    if mode == "running":
        for txn in TRANSACTIONS:
            _run(side.source, [txn])
            time.sleep(0.05)  # some batches of one transaction, some of several
    else:
        _control(pair, "Pause")
        wait_until(lambda: pair.status().state == "paused", 30, "the pause")
        _run(side.source, TRANSACTIONS)
        heads = [pair.head()]

        def captured() -> bool:  # the head moved and then held still for a second
            heads.append(pair.head())
            return heads[-1] > pair.status().level and len(set(heads[-5:])) == 1

        wait_until(captured, 30, "the capture of the transactions", interval=0.25)
        _control(pair, "Resume")
    side.settle()
    rows = side.target_rows()
    assert rows["users"] == [
        (1, "d", "nb"),
        (2, "f", "nc"),
        (3, "a", "na"),
        (5, "c", "n5"),
        (6, "b", "nd"),
    ]
    assert rows["parent"] == [(2, "p3")]
    assert rows["child"] == [(2, 2, None, "c2")]


def _churn(conn: Any, rng: random.Random, n: int) -> None:
    """``n`` transactions over 20 users and 10 parents: swaps and 3-cycles of emails
    through a temporary value, parents and children inserted, re-parented, deleted."""
    txns: list[list[str]] = []
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            i, j = rng.sample(range(1, 21), 2)
            txns.append(_swap(i, j))
        elif kind == 1:
            i, j, k = rng.sample(range(1, 21), 3)
            txns.append(_cycle(i, j, k))
        elif kind == 2:
            p = rng.randrange(1, 11)
            c = rng.randrange(1, 41)
            txns.append(
                [
                    f"DELETE FROM child WHERE id = {c}",
                    f"DELETE FROM parent WHERE id = {p}",
                    f"INSERT INTO parent VALUES ({p}, 'p{p}')",
                    f"INSERT INTO child VALUES ({c}, {p}, {p}, 'c')",
                ]
            )
        else:
            c = rng.randrange(1, 41)
            p = rng.randrange(1, 11)
            txns.append([f"UPDATE child SET p = {p}, v = 'r' WHERE id = {c}"])
    _run(conn, txns)


def _swap(i: int, j: int) -> list[str]:
    """Swap the emails of users i and j through the value 'tmp'."""
    return [
        f"UPDATE users SET nick = email WHERE id IN ({i}, {j})",
        f"UPDATE users SET email = 'tmp' WHERE id = {i}",
        f"UPDATE users SET email = (SELECT nick FROM users WHERE id = {i}) WHERE id = {j}",
        f"UPDATE users SET email = (SELECT nick FROM users WHERE id = {j}) WHERE id = {i}",
        f"UPDATE users SET nick = NULL WHERE id IN ({i}, {j})",
    ]


def _cycle(i: int, j: int, k: int) -> list[str]:
    """Rotate the emails of users i, j, k (i takes j's, j takes k's, k takes i's)."""
    return [
        f"UPDATE users SET nick = email WHERE id IN ({i}, {j}, {k})",
        f"UPDATE users SET email = 'tmp' WHERE id = {i}",
        f"UPDATE users SET email = (SELECT nick FROM users WHERE id = {i}) WHERE id = {k}",
        f"UPDATE users SET email = (SELECT nick FROM users WHERE id = {k}) WHERE id = {j}",
        f"UPDATE users SET email = (SELECT nick FROM users WHERE id = {j}) WHERE id = {i}",
        f"UPDATE users SET nick = NULL WHERE id IN ({i}, {j}, {k})",
    ]


def _beyond(pair: Pair, level: int) -> Callable[[], bool]:
    return lambda: pair.status().level > level


def test_subscriber_sigkill_during_constrained_batches(side: Side) -> None:
    """SIGKILL the subscriber at random moments while it applies batches full of
    unique swaps, cycles and parent/child churn; after a restart the target equals
    the source and the subscription is in sync."""
    pair = side.pair
    rng = random.Random(20)
    _run(
        side.source,
        [
            [f"INSERT INTO users VALUES ({i}, 'e{i}', NULL)" for i in range(1, 21)],
            [f"INSERT INTO parent VALUES ({p}, 'p{p}')" for p in range(1, 11)],
            [f"INSERT INTO child VALUES ({c}, {c % 10 + 1}, 1, 'c')" for c in range(1, 41)],
        ],
    )
    pair.start_publisher()
    _churn(side.source, rng, 1500)
    level = 0
    for _ in range(3):
        pair.start_subscriber()
        wait_until(_beyond(pair, level), 120, "an applied batch")
        time.sleep(rng.uniform(0.0, 0.5))
        assert pair.sub is not None
        level = pair.status().level
        pair.sub.kill()
        _churn(side.source, rng, 300)
    pair.start_subscriber()
    side.settle(timeout=240)


def test_a_constraint_only_the_target_has_parks_the_transaction(side: Side) -> None:
    """A unique index only the target has refuses a source transaction: the
    subscription stops in error with a message naming the table, the key and the
    constraint, the whole transaction is parked in txrepl_errors, nothing of it
    is applied, and the transactions before it are."""
    dst = side.target()
    dst.execute("CREATE UNIQUE INDEX child_v ON child (v)")
    dst.commit()
    dst.close()
    pair = side.pair
    _run(side.source, [["INSERT INTO parent VALUES (1, 'p1')"]])
    pair.start_publisher()
    pair.start_subscriber()
    side.settle()
    good = pair.status().level
    _run(
        side.source,
        [
            [
                "INSERT INTO parent VALUES (2, 'p2')",
                "INSERT INTO child VALUES (10, 1, 1, 'same'), (11, 2, 2, 'same')",
            ]
        ],
    )
    wait_until(lambda: pair.status().state == "error", 120, "the subscription to stop")
    st = pair.status()
    assert st.level == good
    rows = side.target_rows()
    assert rows["parent"] == [(1, "p1")]  # nothing of the refused transaction
    assert rows["child"] == []
    dst = side.target()
    try:
        stored = dst.execute("SELECT seq, status, error FROM txrepl_errors").fetchall()
    finally:
        dst.close()
    assert [(s, status) for s, status, _ in stored] == [(good + 1, "open")]
    error = stored[0][2]
    for word in ("child", "child_v", "same"):
        assert word in error, error
