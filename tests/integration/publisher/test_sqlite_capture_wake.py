"""SQLite capture wakes on the source's writes (issue 23, publisher/capture/sqlite/wake.py):
a change committed while the capture is idle is logged long before the configured
fallback poll interval, in both journal modes, and again after each idle spell."""

from __future__ import annotations

import sqlite3
import sys
import threading
from functools import partial
from pathlib import Path

import pytest

from publisher.capture.sqlite.source import SqliteSource
from publisher.publication import Publication
from tests.support.harness import wait_until
from tests.support.pg_capture import open_pub

FALLBACK_S = 60.0  # the configured poll interval: the capture must not wait for it
DEADLINE_S = 15.0  # generous for a loaded machine, far below the fallback

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="inotify: elsewhere capture polls"
)


def _past(pub: Publication, head: int) -> bool:
    return pub.log.head > head


@pytest.mark.parametrize("journal", ["wal", "delete", "wal, through a symlink"])
def test_a_change_made_while_capture_idles_is_logged_without_the_poll_wait(
    tmp_path: Path, journal: str
) -> None:
    """Also with the source configured as a symlink to a file elsewhere: SQLite writes beside
    the file it points to, and that is what the capture watches."""
    path = tmp_path / "src.db"
    if "symlink" in journal:
        (tmp_path / "real").mkdir()
        path.symlink_to(tmp_path / "real" / "data.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA journal_mode = {journal.split(',')[0]}")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    source = SqliteSource(path, poll_interval_s=FALLBACK_S)
    source.install("shop", "inc-1", ["t"])
    pub = open_pub(tmp_path / "logs", "shop", ["t"])
    halt = threading.Event()
    streaming = threading.Thread(target=source.stream, args=([pub], halt))
    streaming.start()
    try:
        wait_until(lambda: pub.log.head >= 1, 30, "the install's schema entry to be logged")
        for i in range(3):  # each after the capture found nothing more to read
            head = pub.log.head
            conn.execute("INSERT INTO t VALUES (?, 'x')", (i,))
            # within DEADLINE_S, not at the fallback poll FALLBACK_S away
            wait_until(partial(_past, pub, head), DEADLINE_S, f"insert {i} to be logged")
    finally:
        halt.set()
        streaming.join(timeout=30)
        source.release()
    assert not streaming.is_alive()  # a halt is seen despite the long poll interval
