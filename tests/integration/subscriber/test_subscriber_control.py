"""Subscriber control from the CLI, and a real subscriber cut by the queue threshold."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.rpc import txrepl_pb2 as pb
from tests.support.harness import Pair, publisher_admin, wait_until
from tests.support.ledger import (
    LEDGER_COLUMNS,
    ledger_source,
    ledger_txns,
    wait_equal,
)

pytestmark = pytest.mark.spark


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "common.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_pause_resume_reconnect_from_the_cli(tmp_path: Path) -> None:
    """pause, resume and reconnect change the state that status shows."""
    pair = Pair(tmp_path, tables=["counter", "ledger"])
    src = ledger_source(pair.source_path)
    try:
        pair.start_publisher()
        ledger_txns(src, 1, 100)
        sub = pair.start_subscriber()
        pair.wait_caught_up(timeout=120)
        ctl = ["--control", sub.address]

        out = cli("subscriber", "status", *ctl)
        assert out.returncode == 0, out.stderr
        assert "pub1.shop" in out.stdout
        assert "in_sync" in out.stdout

        out = cli("subscriber", "pause", "pub1.shop", *ctl)
        assert out.returncode == 0, out.stderr
        assert pair.status().state == "paused"
        level = pair.status().level
        ledger_txns(src, 101, 50)  # not applied while paused
        wait_until(lambda: pair.head() > level, 10, "capture of the new transactions")
        assert pair.status().level == level

        out = cli("subscriber", "resume", *ctl, "--json")
        assert out.returncode == 0, out.stderr
        resumed = json.loads(out.stdout)["subscriptions"][0]
        assert resumed["name"] == "pub1.shop"
        # The style of every --json (common/jsonout.py): snake_case, numbers as numbers.
        assert isinstance(resumed["level"], int)
        assert resumed["level"] >= level
        assert "last_error" in resumed
        wait_equal(src, pair.target_path, LEDGER_COLUMNS)
        wait_until(lambda: pair.status().state == "in_sync", 30, "in sync after resume")

        out = cli("subscriber", "reconnect", "pub1.shop", *ctl)
        assert out.returncode == 0, out.stderr
        wait_until(
            lambda: (
                [t.state for t in pair.status().timeline][-3:]
                == ["connecting", "syncing", "in_sync"]
            ),
            30,
            "a fresh connection",
        )
        out = cli("subscriber", "pause", "nosuch", *ctl)
        assert out.returncode == 1
        assert "no subscription 'nosuch'" in out.stderr
    finally:
        pair.stop()


def test_slow_subscriber_is_cut_by_queue_threshold_and_converges(tmp_path: Path) -> None:
    """Commits outpace the apply: the feed is cut, the subscriber resumes, and converges.

    The apply is throttled where it would be in real life, at the target: the test
    holds the target's write lock, so the apply waits (the writer's busy timeout)
    while the source keeps committing.
    """
    pair = Pair(
        tmp_path,
        tables=["counter", "ledger"],
        publication_extra={"queue_threshold": 3},
        subscriber_extra={"batch": {"max_entries": 1, "queue_batches": 1}},
    )
    src = ledger_source(pair.source_path)
    try:
        pair.start_publisher()
        ledger_txns(src, 1, 10)
        pair.start_subscriber()
        pair.wait_caught_up(timeout=120)
        stop = threading.Event()

        def load() -> None:
            # Steady commits until the cut is seen: a burst would be captured as a few
            # large entries (the capture groups what each poll finds), too few to
            # pass the threshold while the apply is held.
            start = 11
            while not stop.is_set() and start < 20000:
                ledger_txns(src2, start, 5)
                start += 5
                time.sleep(0.01)

        src2 = sqlite3.connect(
            str(pair.source_path), isolation_level=None, timeout=30, check_same_thread=False
        )

        def cut() -> bool:
            assert pair.pub is not None
            resp = publisher_admin(pair.pub.address).ListSubscribers(pb.ListSubscribersRequest())
            return any("queue threshold" in s.last_cut_reason for s in resp.subscribers)

        # The target's write lock is held while the source commits: the apply waits,
        # nothing is acked, and the entries pile up past the threshold.
        blocker = sqlite3.connect(str(pair.target_path), isolation_level=None, timeout=30)
        blocker.execute("BEGIN IMMEDIATE")
        writer = threading.Thread(target=load)
        writer.start()
        try:
            wait_until(cut, 60, "a queue-threshold cut")
        finally:
            blocker.execute("COMMIT")
            blocker.close()
            stop.set()
            writer.join()
        wait_equal(src, pair.target_path, LEDGER_COLUMNS, timeout=180)
        assert any("ABORTED" in t.reason for t in pair.status().timeline)
    finally:
        pair.stop()


def test_subscriptions_are_independent(tmp_path: Path) -> None:
    """Pausing one subscription in a daemon does not stall the other."""
    from tests.support.harness import Daemon, subscription_status, to_toml

    src = ledger_source(tmp_path / "source.db")
    pub_cfg = {
        "server_name": "pub1",
        "listen": "127.0.0.1:0",
        "data_dir": str(tmp_path / "publisher"),
        "source": f"sqlite:///{tmp_path / 'source.db'}",
        "poll_interval_ms": 2,
        "publication": [
            {"name": "counters", "tables": ["counter"]},
            {"name": "ledger", "tables": ["ledger"]},
        ],
    }
    (tmp_path / "publisher.toml").write_text(to_toml(pub_cfg))
    pub = Daemon(
        "publisher",
        tmp_path / "publisher.toml",
        tmp_path / "publisher" / "publisher.addr",
        tmp_path / "publisher.log",
    ).start()
    sub = None
    try:
        sub_cfg = {
            "server_name": "sub1",
            "target": f"sqlite:///{tmp_path / 'target.db'}",
            "control_listen": "127.0.0.1:0",
            "data_dir": str(tmp_path / "subscriber"),
            "subscription": [
                {"publisher": "pub1", "address": pub.address, "publication": "counters"},
                {"publisher": "pub1", "address": pub.address, "publication": "ledger"},
            ],
        }
        (tmp_path / "subscriber.toml").write_text(to_toml(sub_cfg))
        sub = Daemon(
            "subscriber",
            tmp_path / "subscriber.toml",
            tmp_path / "subscriber" / "subscriber.addr",
            tmp_path / "subscriber.log",
        ).start()

        def states() -> dict[str, str]:
            assert sub is not None
            return {s.name: s.state for s in subscription_status(sub.address)}

        wait_until(lambda: set(states().values()) == {"in_sync"}, 120, "both in sync")
        out = cli("subscriber", "pause", "pub1.counters", "--control", sub.address)
        assert out.returncode == 0, out.stderr
        ledger_txns(src, 1, 200)
        wait_equal(src, tmp_path / "target.db", {"ledger": LEDGER_COLUMNS["ledger"]})
        assert states() == {"pub1.counters": "paused", "pub1.ledger": "in_sync"}
        # The paused one did not move; after resume it catches up.
        cli("subscriber", "resume", "pub1.counters", "--control", sub.address)
        wait_equal(src, tmp_path / "target.db", LEDGER_COLUMNS)
    finally:
        if sub is not None:
            sub.stop()
        pub.stop()
