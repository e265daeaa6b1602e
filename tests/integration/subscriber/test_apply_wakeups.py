"""In sync, the session's apply thread takes each next batch itself (issue 23).

A real subscription (SubscriptionRunner, the real Applier into a SQLite file, no
Spark: its session would fail if started) follows the in-process publication served
on a real gRPC port (tests/support/feedserver.py).  Entries are appended one at a
time, each once the one before is applied: one entry per batch, one target
transaction each.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any, cast

from common.backoff import Backoff
from common.client import insert_op
from common.rpc import txrepl_pb2 as pb
from publisher.registry import Registry
from subscriber.apply import Applier
from subscriber.apply.lazy import LazySpark
from subscriber.config import BatchConfig, SubscriptionConfig
from subscriber.subscription import SubscriptionRunner
from subscriber.targets.sqlite import SqliteWriter
from tests.support.aiowait import until as _until
from tests.support.feedserver import served_feeds

N = 40


def _no_spark() -> Any:
    raise RuntimeError("an in-sync batch of a few rows needs no Spark")


async def test_in_sync_batches_do_not_wake_the_event_loop_each(tmp_path: Path) -> None:
    """Forty one-entry batches applied in sync wake the event loop from another thread
    a handful of times (an ack writer's start), not once per batch (the apply's end
    handed back, then the next batch handed over); every entry reaches the target with
    its level, and the publisher is acknowledged the last level."""
    async with served_feeds(tmp_path, Registry) as served:
        config = SubscriptionConfig(
            publisher="pub1", address=served.address, publication="shop", name="s1"
        )
        target = tmp_path / "target.db"
        applier = Applier(cast(Any, LazySpark(_no_spark)), SqliteWriter(str(target)), config.id)
        runner = SubscriptionRunner(
            config,
            "sub1",
            applier,
            # A long ack interval: the writer started by the first ack is still running
            # for the later ones, so an ack costs no wake-up (the bench's default 5 ms
            # is a wake-up per 5 ms at most).
            batch=BatchConfig(ack_interval_ms=1000),
            backoff=Backoff(initial_s=0.05, max_s=0.2),
        )
        task = asyncio.create_task(runner.run())
        try:
            await _until(lambda: runner.state == "in_sync", "in sync")
            loop = asyncio.get_running_loop()
            ours = threading.get_ident()
            woken: list[str] = []
            original = loop.call_soon_threadsafe

            def counting(callback: Any, *args: Any, **kw: Any) -> Any:
                if threading.get_ident() != ours:
                    woken.append(getattr(callback, "__qualname__", repr(callback)))
                return original(callback, *args, **kw)

            loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
            try:
                for i in range(N):
                    served.pub.append(pb.Entry(ops=[insert_op("notes", [i, "x"])]))
                    head = served.pub.log.head
                    await _until(lambda: runner.level == head, f"entry {i} applied")  # noqa: B023
            finally:
                del loop.call_soon_threadsafe
            assert len(woken) <= 5, woken
            head = served.pub.log.head

            def acked() -> bool:
                row = served.registry.get("shop", "sub1")
                return row is not None and row.level == head

            await _until(acked, "the publisher to record the last level")
        finally:
            runner.stop()
            await task
    conn = sqlite3.connect(str(target))
    try:
        assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == N
    finally:
        conn.close()
