"""A subscriber whose every subscription is in ``error`` does not say SERVING: a real
pair whose publisher comes back with a new log (a new incarnation) under it."""

from __future__ import annotations

import shutil
import socket
import sqlite3
from pathlib import Path

from tests.support.harness import Pair, wait_until
from tests.support.notify import health
from tests.support.scrape import scrape

COMPONENT = "txrepl.subscription.pub1.shop"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_subscription_in_error_is_not_serving(tmp_path: Path) -> None:
    """In sync: SERVING.  The publisher's log replaced (same address, new incarnation):
    the subscription goes to error and the subscriber, its only one stuck, reports
    NOT_SERVING for it and as a whole, in gRPC health and /metrics."""
    pair = Pair(tmp_path, tables=["t"])
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    listen = f"127.0.0.1:{_free_port()}"
    try:
        pair.start_publisher(listen)
        sub = pair.start_subscriber()
        for i in range(5):
            src.execute("INSERT INTO t VALUES (?, 'x')", (i,))

        def applied() -> bool:
            with sqlite3.connect(pair.target_path) as target:
                try:
                    return bool(target.execute("SELECT count(*) FROM t").fetchone() == (5,))
                except sqlite3.OperationalError:  # no table yet
                    return False

        wait_until(applied, 120, "the rows applied")
        wait_until(lambda: health(sub.address, service=COMPONENT) == "SERVING", 10, "SERVING")
        assert health(sub.address) == "SERVING"

        # The publisher loses its data directory and starts afresh on the same address:
        # a new incarnation, which the subscription cannot follow without a reinit.
        assert pair.pub is not None
        pair.pub.stop()
        shutil.rmtree(tmp_path / "publisher")
        pair.start_publisher(listen)
        wait_until(lambda: pair.status().state == "error", 60, "the subscription in error")
        wait_until(
            lambda: (
                (health(sub.address), health(sub.address, service=COMPONENT))
                == ("NOT_SERVING", "NOT_SERVING")
            ),
            10,
            "NOT_SERVING",
        )
        assert health(sub.address, service="txrepl.v1.SubscriberControl") == "SERVING"
        m = scrape(sub.metrics_address)
        assert m[("txrepl_health_serving", frozenset({("service", "")}))] == 0
        assert m[("txrepl_health_serving", frozenset({("service", COMPONENT)}))] == 0
    finally:
        pair.stop()
        src.close()
