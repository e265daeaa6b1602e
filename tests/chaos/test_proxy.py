"""A TCP proxy between subscriber and publisher drops, stalls and resets the connection
mid-stream; the subscriber must resume from its level and converge, losing nothing.

The publication's send timeout is 2 s, so a stall longer than that also makes the
publisher cut the feed; the subscriber's reconnect backoff is capped at 1 s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.chaos_stream import TABLES, StreamWriter, prepare_target, verify
from tests.support.harness import Daemon, Pair, wait_until
from tests.support.proxy import FaultProxy

pytestmark = pytest.mark.spark


def _moved(pair: Pair, level: int) -> Callable[[], bool]:
    return lambda: pair.status().level > level


def _proxy_run(tmp_path: Path, faults: int, seed: int) -> None:
    rng = random.Random(seed)
    pair = Pair(
        tmp_path,
        tables=TABLES,
        publication_extra={"send_timeout_s": 2.0, "heartbeat_s": 0.5},
    )
    writer = StreamWriter(pair.source_path, rate=150)
    prepare_target(pair.target_path)
    proxy: FaultProxy | None = None
    try:
        pub = pair.start_publisher()
        proxy = FaultProxy(pub.address).start()
        pair.sub = Daemon(
            "subscriber",
            pair.write_subscriber_config(proxy.address),
            tmp_path / "subscriber" / "subscriber.addr",
            tmp_path / "subscriber.log",
        ).start()
        writer.start()
        wait_until(lambda: pair.status().level > 0, 180, "a first applied batch")
        for _ in range(faults):
            writer.check()
            # Only break a live feed: wait for the subscriber to be connected and moving.
            wait_until(lambda: proxy is not None and proxy.connections > 0, 60, "a connection")
            wait_until(_moved(pair, pair.status().level), 60, "progress through the proxy")
            time.sleep(rng.uniform(0.0, 1.0))
            kind = rng.choice(["drop", "reset", "stall", "stall_long"])
            if kind == "drop":
                proxy.drop()
            elif kind == "reset":
                proxy.reset()
            elif kind == "stall":
                proxy.stall(rng.uniform(0.2, 1.5))
            else:
                proxy.stall(rng.uniform(2.5, 4.0))  # beyond the send timeout
                time.sleep(4.0)
        committed = writer.stop()
        summary = verify(pair.source_path, pair.target_path, committed, timeout=240)
        timeline = pair.status().timeline
        print(
            f"injected through the proxy: {dict(proxy.faults)} "
            f"({proxy.accepted} connections accepted) under a W1+ledger stream at 150 txn/s"
        )
        print(
            f"subscriber states seen (last 100): "
            f"{sum(t.state == 'connecting' for t in timeline)} reconnects"
        )
        print(summary)
        assert proxy.accepted > 1, "the subscriber never reconnected"
    finally:
        if writer.is_alive():
            writer.halt.set()
        pair.stop()
        if proxy is not None:
            proxy.stop()


@pytest.mark.short_of("test_many_network_faults_converge")
def test_drops_stalls_and_resets_converge(tmp_path: Path) -> None:
    """Six network faults mid-stream: the subscriber resumes each time and converges."""
    _proxy_run(tmp_path, faults=6, seed=21)


@pytest.mark.slow
def test_many_network_faults_converge(tmp_path: Path) -> None:
    """Twenty network faults mid-stream: the subscriber resumes each time and converges."""
    _proxy_run(tmp_path, faults=20, seed=22)
