"""An updatable subscription with real daemons: rows changed on the SQLite target,
then by the source; conflicts detected, resolved and logged, seen by ``txrepl
subscriber conflicts``, ``status`` and the metrics; and a kill -9 of the subscriber
in the middle of a conflicting batch loses and repeats no conflict."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.support.harness import Pair, txrepl_cli, wait_until
from tests.support.scrape import scrape

pytestmark = pytest.mark.spark


def _rows(path: Path, where: str = "1") -> list[tuple[object, ...]]:
    with sqlite3.connect(str(path)) as conn:
        return conn.execute(f"SELECT id, v FROM t WHERE {where} ORDER BY id").fetchall()


def _synced(pair: Pair, where: str = "1") -> None:
    """Wait until the target holds the source's rows (``where``) and is in sync."""

    def equal() -> bool:
        try:
            return _rows(pair.target_path, where) == _rows(pair.source_path, where)
        except sqlite3.OperationalError:  # the target's table not created yet
            return False

    wait_until(equal, 60, "equal rows")
    pair.wait_caught_up()


def _pair(tmp_path: Path) -> tuple[Pair, sqlite3.Connection]:
    pair = Pair(tmp_path, tables=["t"], subscription_extra={"conflicts": "publisher_wins"})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    return pair, src


def _locked(path: Path) -> bool:
    """True while another connection holds the target's write lock (a batch applying)."""
    conn = sqlite3.connect(str(path), timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def test_updatable_subscription_conflicts_logged_once_across_a_kill(tmp_path: Path) -> None:
    """Target rows changed locally, then at the source: publisher wins, both rows of each
    conflict are in the log, the CLI, status and the metrics; a kill -9 of the subscriber
    inside a batch of conflicts loses and repeats none of them."""
    n = 1500
    pair, src = _pair(tmp_path)
    try:
        pair.start_publisher()
        sub = pair.start_subscriber()
        src.execute("BEGIN")
        src.executemany(
            "INSERT INTO t VALUES (?, 'a')", [(i,) for i in [1, 2, 3, *range(100, 100 + n)]]
        )
        src.execute("COMMIT")
        _synced(pair)
        with sqlite3.connect(str(pair.target_path)) as tgt:
            tgt.execute("UPDATE t SET v = 'local' WHERE id = 1 OR id >= 100")
            tgt.execute("DELETE FROM t WHERE id = 2")
        src.execute("UPDATE t SET v = 'pub' WHERE id < 100")
        _synced(pair, "id < 100")
        config = str(tmp_path / "subscriber.toml")
        listed = txrepl_cli("subscriber", "conflicts", "--config", config, "--json")
        assert listed.returncode == 0, listed.stderr
        got = {
            (json.loads(c["row_key"])["id"], c["kind"], c["decision"]): c
            for c in json.loads(listed.stdout)["conflicts"]
        }
        assert set(got) == {
            (1, "update_changed", "take_publisher"),
            (2, "update_missing", "take_publisher"),
        }
        assert json.loads(got[1, "update_changed", "take_publisher"]["local_row"])["v"] == "local"
        text = txrepl_cli("subscriber", "conflicts", "pub1.shop", "--config", config)
        assert text.returncode == 0
        assert "update_missing" in text.stdout
        status = txrepl_cli("subscriber", "status", "--control", sub.address, "--json")
        [st] = json.loads(status.stdout)["subscriptions"]
        assert st["conflicts"] == [{"table": "t", "count": 2}]
        status = txrepl_cli("subscriber", "status", "--control", sub.address)
        assert "conflicts: t 2" in status.stdout
        samples = scrape(sub.metrics_address)
        key = frozenset({("subscription", "pub1.shop"), ("table", "t")})
        assert samples[("txrepl_subscription_conflicts_total", key)] == 2
        # One entry of n update conflicts; killed while its transaction is open.
        before = pair.status().level
        src.execute("UPDATE t SET v = 'pub' WHERE id >= 100")
        wait_until(lambda: _locked(pair.target_path), 60, "the conflicting batch to start", 0.002)
        sub.kill()
        with sqlite3.connect(str(pair.target_path)) as tgt:
            level = tgt.execute("SELECT level FROM txrepl_subscriptions").fetchone()[0]
            logged = tgt.execute("SELECT count(*) FROM txrepl_conflicts").fetchone()[0]
        assert (level, logged) == (before, 2)  # killed inside the batch: nothing of it stayed
        pair.start_subscriber()
        _synced(pair)
        with sqlite3.connect(str(pair.target_path)) as tgt:
            kinds = tgt.execute("SELECT kind, count(*) FROM txrepl_conflicts GROUP BY kind")
            assert kinds.fetchall() == [("update_changed", n + 1), ("update_missing", 1)]
            keys = tgt.execute("SELECT count(DISTINCT row_key) FROM txrepl_conflicts").fetchone()
            assert keys == (n + 2,)
        assert [(c.table, c.count) for c in pair.status().conflicts] == [("t", n + 2)]
    finally:
        src.close()
        pair.stop()


@pytest.mark.postgres
def test_updatable_subscription_into_postgresql(tmp_path: Path, pg_db: str) -> None:
    """The same with a PostgreSQL target and subscriber_wins: the rows changed there
    stay, the source's changes of them are in the log, counted in status."""
    import psycopg

    pair = Pair(
        tmp_path,
        tables=["t"],
        target_url=pg_db,
        subscription_extra={"conflicts": "subscriber_wins"},
    )
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")

    def target() -> list[tuple[object, ...]]:
        with psycopg.connect(pg_db) as conn:
            try:
                return conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
            except psycopg.errors.UndefinedTable:
                return []

    try:
        pair.start_publisher()
        sub = pair.start_subscriber()
        src.executemany("INSERT INTO t VALUES (?, 'a')", [(1,), (2,), (3,)])
        wait_until(lambda: target() == _rows(pair.source_path), 60, "the rows")
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("UPDATE t SET v = 'local' WHERE id = 1")
            conn.execute("DELETE FROM t WHERE id = 2")
        src.execute("UPDATE t SET v = 'pub'")
        wait_until(lambda: (3, "pub") in target(), 60, "the source's update")
        pair.wait_caught_up()
        assert target() == [(1, "local"), (3, "pub")]
        config = str(tmp_path / "subscriber.toml")
        listed = txrepl_cli("subscriber", "conflicts", "--config", config, "--json")
        assert listed.returncode == 0, listed.stderr
        got = sorted((c["kind"], c["decision"]) for c in json.loads(listed.stdout)["conflicts"])
        assert got == [("update_changed", "ignore"), ("update_missing", "ignore")]
        assert [(c.table, c.count) for c in pair.status().conflicts] == [("t", 2)]
        assert sub.running
    finally:
        src.close()
        pair.stop()
