"""Releasing logged capture rows off the capture loop (publisher/capture/sqlite/release.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

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
