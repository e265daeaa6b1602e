"""SQLite capture and the application's write lock: capture waits, counts, never fails."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from publisher.capture.sqlite import SqliteCapture
from publisher.errors import SourceError


def _source(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    return conn


def _hold_write_lock(path: Path, seconds: float, started: threading.Event) -> threading.Thread:
    """The application: BEGIN IMMEDIATE in its own connection, a write, held ``seconds``."""

    def run() -> None:
        app = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
        app.execute("BEGIN IMMEDIATE")
        app.execute("INSERT INTO t VALUES (1000, 'held')")
        started.set()
        time.sleep(seconds)
        app.execute("COMMIT")
        app.close()

    th = threading.Thread(target=run)
    th.start()
    return th


def test_capture_waits_for_the_write_lock_counts_it_and_captures_everything(
    tmp_path: Path,
) -> None:
    path = tmp_path / "src.db"
    src = _source(path)
    cap = SqliteCapture(path)
    cap.install("p", "inc-1", ["t"])
    for i in range(50):
        src.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * 100))
    rows = cap.read(0)
    assert len(rows) == 51  # the schema row, then the 50 inserts
    started = threading.Event()
    holder = _hold_write_lock(path, 1.2, started)
    assert started.wait(5)
    t0 = time.monotonic()
    cap.release(rows[-1].id)  # a write: waits behind the application, does not fail
    waited = time.monotonic() - t0
    holder.join()
    assert waited >= 0.8
    assert cap.health.lock_waits >= 2  # said so, in the counter the metric exports
    after = cap.read(rows[-1].id)
    assert len(after) == 1  # the application's held write, captured
    (left,) = src.execute("SELECT count(*) FROM _txrepl_capture").fetchone()
    assert left == 1  # the released rows are gone, the new one is kept
    assert cap.read(0)[0].id == after[0].id


def test_capture_locked_past_its_bound_fails_with_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "src.db"
    src = _source(path)
    cap = SqliteCapture(path, busy_timeout_s=0.5)
    cap.install("p", "inc-1", ["t"])
    src.execute("INSERT INTO t VALUES (1, 'a')")
    started = threading.Event()
    holder = _hold_write_lock(path, 1.5, started)
    assert started.wait(5)
    with pytest.raises(SourceError, match=r"stayed locked by another connection for more than"):
        cap.release(10)
    holder.join()
    assert cap.health.lock_waits >= 1
    cap.release(10)  # the lock is gone: it goes on
