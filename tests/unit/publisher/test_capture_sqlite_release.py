"""Releasing logged capture rows off the capture loop (publisher/capture/sqlite/release.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from publisher.capture.health import CaptureHealth
from publisher.capture.sqlite import SqliteCapture
from publisher.capture.sqlite.release import Releaser


def _source(tmp_path: Path, rows: int) -> sqlite3.Connection:
    db = tmp_path / "src.db"
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    SqliteCapture(db).install("p", "inc", ["t"])
    conn.executemany("INSERT INTO t VALUES (?, 'x')", [(i,) for i in range(rows)])
    return conn


def _ids(conn: sqlite3.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM _txrepl_capture ORDER BY id")]


def test_rows_up_to_the_bound_are_deleted_and_no_others(tmp_path: Path) -> None:
    conn = _source(tmp_path, 1200)  # more than one RELEASE_BATCH
    ids = _ids(conn)
    bound = ids[1100]
    releaser = Releaser(tmp_path / "src.db", CaptureHealth())
    try:
        releaser.request(bound)
        assert releaser.wait(10)
        assert _ids(conn) == [i for i in ids if i > bound]
        releaser.request(bound - 5)  # a lower bound changes nothing
        assert releaser.wait(10)
        assert _ids(conn) == [i for i in ids if i > bound]
    finally:
        releaser.close()


def test_a_request_does_not_wait_for_the_write_lock(tmp_path: Path) -> None:
    """The application holds the write lock: the request returns at once (the capture
    loop goes on polling), the lock waits are counted, and the rows go once it commits."""
    conn = _source(tmp_path, 10)
    ids = _ids(conn)
    health = CaptureHealth()
    releaser = Releaser(tmp_path / "src.db", health)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (100, 'held')")
        t0 = time.monotonic()
        releaser.request(ids[-1])
        assert time.monotonic() - t0 < 0.2
        assert not releaser.wait(1.0)  # still waiting for the lock
        assert health.lock_waits >= 1
        conn.execute("COMMIT")
        assert releaser.wait(30)
        assert len(_ids(conn)) == 1  # the held transaction's own row, above the bound
    finally:
        releaser.close()


def test_a_backlog_is_released_after_its_subscribers_had_time_to_apply_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll that logs a backlog leaves its capture rows in place for RELEASE_DEFER_S
    (the CPU goes to the subscribers applying it); the first poll after that releases
    them, so nothing is kept for good."""
    from publisher.capture.sqlite import source as sqlite_source
    from tests.support.pg_capture import open_pub

    monkeypatch.setattr(sqlite_source, "RELEASE_ROWS", 100)
    monkeypatch.setattr(sqlite_source, "RELEASE_DEFER_S", 0.3)
    db = tmp_path / "src.db"
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    source = sqlite_source.SqliteSource(db)
    try:
        source.install("p", "inc", ["t"])
        conn.executemany("INSERT INTO t VALUES (?, 'x')", [(i,) for i in range(500)])
        pub = open_pub(tmp_path / "logs", "p", ["t"])
        source.pubs = [pub]
        backlog = _ids(conn)
        assert len(backlog) > 500  # the rows and the table's schema row
        assert source.step() == 1  # the backlog, logged
        assert source.releaser.wait(10)
        assert _ids(conn) == backlog  # kept: its release is put off
        time.sleep(0.35)  # past RELEASE_DEFER_S
        conn.execute("INSERT INTO t VALUES (1000, 'y')")
        assert source.step() == 1
        assert source.releaser.wait(10)
        assert _ids(conn) == []  # every logged row released
    finally:
        source.release()
        conn.close()
