"""A scheduled subscription, driven by a fake clock against a real publisher."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import time
from pathlib import Path

import pytest

from common.backoff import Backoff
from subscriber.apply import Applier
from subscriber.config import BatchConfig, SubscriptionConfig
from subscriber.schedule import FakeClock, Schedule
from subscriber.subscription import SubscriptionRunner
from subscriber.targets.sqlite import SqliteWriter
from tests.support.harness import Pair
from tests.support.ledger import ledger_source, ledger_txns

pytestmark = pytest.mark.spark


async def until(cond, timeout: float = 60) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


def _captured(pair: Pair) -> int:
    """Wait until the publisher has moved every captured row into the log; the head."""
    conn = sqlite3.connect(str(pair.source_path))
    try:
        deadline = time.monotonic() + 60
        while conn.execute("SELECT count(*) FROM _txrepl_capture").fetchone()[0]:
            assert time.monotonic() < deadline, "capture did not take the rows within 60 s"
            time.sleep(0.01)
    finally:
        conn.close()
    return pair.head()


async def test_connects_at_scheduled_times_syncs_then_disconnects(tmp_path: Path, spark) -> None:
    """Runs at Monday and Wednesday 02:00: waits, catches up to the head, disconnects, waits."""
    pair = Pair(tmp_path, tables=["counter", "ledger"])
    src = ledger_source(pair.source_path)
    try:
        pub = pair.start_publisher()
        ledger_txns(src, 1, 200)
        head = await asyncio.to_thread(_captured, pair)
        monday_1am = dt.datetime(2026, 11, 23, 1, 0, tzinfo=dt.UTC).timestamp()
        clock = FakeClock(monday_1am)
        cfg = SubscriptionConfig(
            publisher="pub1",
            address=pub.address,
            publication="shop",
            schedule=Schedule(at=["02:00"], weekdays=["mon", "wed"]),
        )
        applier = Applier(spark, SqliteWriter(pair.target_path), subscription=cfg.id)
        runner = SubscriptionRunner(
            cfg,
            "sub1",
            applier,
            batch=BatchConfig(),
            backoff=Backoff(initial_s=0.05, max_s=0.2),
            clock=clock,
        )
        task = asyncio.create_task(runner.run())
        await until(lambda: clock.sleeping)
        assert clock.sleeps == [3600.0]  # 01:00 -> 02:00
        assert runner.state == "scheduled"
        assert runner.level == 0
        clock.advance()
        await until(lambda: runner.runs == 1 and clock.sleeping)
        assert runner.level == head
        assert runner.state == "scheduled"
        assert clock.sleeps[1] == 2 * 86400.0  # Monday 02:00 -> Wednesday 02:00
        states = [s for _, s, _ in runner.timeline]
        assert states[-4:] == ["connecting", "syncing", "in_sync", "scheduled"]

        ledger_txns(src, 201, 100)  # written while disconnected
        head2 = await asyncio.to_thread(_captured, pair)
        assert runner.level == head  # nothing moves between runs
        clock.advance()
        await until(lambda: runner.runs == 2 and clock.sleeping)
        assert runner.level == head2
        runner.stop()
        await asyncio.wait_for(task, 30)
    finally:
        pair.stop()
