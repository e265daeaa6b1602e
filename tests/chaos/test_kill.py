"""SIGKILL the publisher and the subscriber at random moments under a W1-style stream.

A subscriber restart costs a Spark start (~8-10 s here) and a publisher restart under
a second, so most kills hit the publisher: the default variant kills the publisher 6
times and the subscriber once; the slow variant kills the publisher 60 times and the
subscriber 4 times (64 kills; with the log's 80, PostgreSQL capture's 60 and the
apply's 5, the slow suite holds 209).  Afterwards the target must equal the source (W1
checksum), with every ledger row present and written exactly once (tests/support/chaos_stream.py).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.support.chaos_stream import TABLES, StreamWriter, prepare_target, verify
from tests.support.harness import Pair, wait_until

pytestmark = pytest.mark.spark

RATE = 100  # txn/s: enough to keep capture, feed and apply busy at every kill


def _kill_run(tmp_path: Path, publisher_kills: int, subscriber_kills: int, seed: int) -> None:
    rng = random.Random(seed)
    pair = Pair(tmp_path, tables=TABLES)
    writer = StreamWriter(pair.source_path, rate=RATE)
    prepare_target(pair.target_path)
    plan = ["publisher"] * publisher_kills + ["subscriber"] * subscriber_kills
    rng.shuffle(plan)
    killed = {"publisher": 0, "subscriber": 0}
    try:
        pub = pair.start_publisher()
        port = pub.address.rsplit(":", 1)[1]
        writer.start()
        pair.start_subscriber()
        wait_until(lambda: pair.status().level > 0, 180, "a first applied batch")
        for victim in plan:
            writer.check()
            if victim == "publisher":
                # Anywhere from mid-capture to mid-feed: the writer never stops.
                time.sleep(rng.uniform(0.05, 0.6))
                assert pair.pub is not None
                pair.pub.kill()
                time.sleep(rng.uniform(0.0, 0.2))
                pair.start_publisher(listen=f"127.0.0.1:{port}")
            else:
                # Wait for the subscriber to be applying, then kill it mid-stream.
                wait_until(
                    lambda: pair.status().state in ("syncing", "in_sync"), 120, "a live feed"
                )
                time.sleep(rng.uniform(0.0, 1.5))
                assert pair.sub is not None
                pair.sub.kill()
                pair.start_subscriber()
            killed[victim] += 1
        committed = writer.stop()
        summary = verify(pair.source_path, pair.target_path, committed, timeout=240)
        print(
            f"injected: SIGKILL of the publisher x{killed['publisher']} and of the subscriber "
            f"x{killed['subscriber']} under a W1+ledger stream at {RATE} txn/s"
        )
        print(summary)
    finally:
        if writer.is_alive():
            writer.halt.set()
        pair.stop()


@pytest.mark.short_of("test_many_sigkills_lose_and_duplicate_nothing")
def test_random_sigkills_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Seven SIGKILLs of both daemons mid-stream: target = source, every row once."""
    _kill_run(tmp_path, publisher_kills=6, subscriber_kills=1, seed=11)


@pytest.mark.slow
def test_many_sigkills_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """60 publisher and 4 subscriber SIGKILLs mid-stream: target = source, every row once."""
    _kill_run(tmp_path, publisher_kills=60, subscriber_kills=4, seed=12)
