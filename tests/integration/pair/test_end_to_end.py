"""End to end with real processes: SQLite source → publisher → gRPC → subscriber → SQLite target."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

import pytest

from tests.support.harness import Pair, wait_until
from tests.support.ledger import LEDGER_COLUMNS, ledger_source, ledger_txns, wait_equal
from tests.support.workload import (
    W1,
    W1_COLUMNS,
    run_sqlite,
    sqlite_source,
    w1_checksum,
)

pytestmark = pytest.mark.spark


def test_catch_up_then_live(tmp_path: Path) -> None:
    """A backlog written before the subscriber starts, then live traffic: target = source."""
    pair = Pair(tmp_path, tables=["accounts", "orders"])
    src = sqlite_source(pair.source_path)
    w1 = W1(accounts=500)
    run_sqlite(src, w1.transactions(1))
    try:
        pair.start_publisher()
        run_sqlite(src, w1.transactions(1500))
        pair.start_subscriber()
        pair.wait_caught_up(timeout=180)
        states = [t.state for t in pair.status().timeline]
        assert "syncing" in states
        assert states[-1] == "in_sync"
        run_sqlite(src, w1.transactions(500))
        wait_equal(src, pair.target_path, W1_COLUMNS)
        dst = sqlite3.connect(str(pair.target_path))
        assert w1_checksum(src) == w1_checksum(dst)
        st = pair.status()
        assert st.state == "in_sync"
        # Live batches at the head are not transitions: the timeline keeps the real
        # ones (one in_sync after syncing), and one stream carried everything.
        states = [t.state for t in st.timeline]
        assert states.count("in_sync") == 1, states
        assert st.sessions == 1, states
    finally:
        pair.stop()


def test_subscriber_sigkill_mid_apply_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """SIGKILL the subscriber at random moments while it applies; then target = source."""
    pair = Pair(tmp_path, tables=["counter", "ledger"])
    src = ledger_source(pair.source_path)
    rng = random.Random(3)
    try:
        pair.start_publisher()
        ledger_txns(src, 1, 3000)
        for kills in range(1, 4):
            pair.start_subscriber()
            # Wait for the first batch to land, then kill at a random moment.
            wait_until(lambda: pair.status().level > 0, 120, "a first applied batch")
            time.sleep(rng.uniform(0.0, 0.6))
            assert pair.sub is not None
            level_before = pair.status().level
            pair.sub.kill()
            # More traffic while the subscriber is down.
            ledger_txns(src, 3001 + (kills - 1) * 500, 500)
            print(f"kill {kills}: subscriber level was ~{level_before}")
        pair.start_subscriber()
        wait_equal(src, pair.target_path, LEDGER_COLUMNS, timeout=180)
        dst = sqlite3.connect(str(pair.target_path))
        (n,) = dst.execute("SELECT n FROM counter WHERE id = 1").fetchone()
        (rows,) = dst.execute("SELECT count(*) FROM ledger").fetchone()
        assert n == rows == 3000 + 3 * 500
    finally:
        pair.stop()


def test_publisher_killed_and_restarted_subscriber_resumes(tmp_path: Path) -> None:
    """SIGKILL the publisher; on restart (same port) the subscriber reconnects by itself."""
    pair = Pair(tmp_path, tables=["counter", "ledger"])
    src = ledger_source(pair.source_path)
    try:
        pub = pair.start_publisher()
        ledger_txns(src, 1, 300)
        pair.start_subscriber()
        pair.wait_caught_up(timeout=180)
        port = pub.address.rsplit(":", 1)[1]
        pub.kill()
        wait_until(
            lambda: pair.status().state not in ("in_sync", "syncing"),
            30,
            "the subscriber to notice",
        )
        ledger_txns(src, 301, 300)  # captured when the publisher comes back
        pair.start_publisher(listen=f"127.0.0.1:{port}")
        ledger_txns(src, 601, 100)
        wait_equal(src, pair.target_path, LEDGER_COLUMNS)
        pair.wait_caught_up(timeout=60)
        reasons = [t.reason for t in pair.status().timeline]
        assert any("UNAVAILABLE" in r or "stream ended" in r for r in reasons), reasons
    finally:
        pair.stop()


def test_unknown_publication_is_not_found_and_retried(tmp_path: Path) -> None:
    """A subscription to a publication the publisher lacks logs NOT_FOUND and keeps retrying."""
    pair = Pair(tmp_path, tables=["counter"])
    ledger_source(pair.source_path)
    try:
        pair.start_publisher()
        pair.publication = "nosuch"
        sub = pair.start_subscriber()
        wait_until(
            lambda: sum("NOT_FOUND" in t.reason for t in pair.status().timeline) >= 2,
            60,
            "two NOT_FOUND refusals",
        )
        assert sub.running
        st = pair.status()
        assert "publication 'nosuch' not found" in st.last_error
        assert "NOT_FOUND" in sub.tail(200)
    finally:
        pair.stop()
