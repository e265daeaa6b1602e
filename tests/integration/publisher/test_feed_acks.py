"""A feed records the subscriber's acknowledged level behind the acks (publisher/acks.py).

In process: a real log and registry (SQLite files), the real FeedManager behind a
real gRPC server on port 0, a raw subscriber that acknowledges every batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from common.client import insert_op
from common.rpc import txrepl_pb2 as pb
from publisher.registry import Registry
from tests.support.feedclient import RawSubscriber
from tests.support.feedserver import ServedFeeds, served_feeds


class CountingRegistry(Registry):
    """The registry, counting the acknowledged levels written to it."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.ack_writes = 0

    def ack(
        self, publication: str, subscriber: str, level: int, level_time: float | None = None
    ) -> None:
        self.ack_writes += 1
        super().ack(publication, subscriber, level, level_time)


class Served(ServedFeeds[CountingRegistry]):
    def append(self, n: int, start: int = 0) -> None:
        for i in range(start, start + n):
            self.pub.append(pb.Entry(ops=[insert_op("notes", [i, "x"])]))

    def level(self, subscriber: str) -> int:
        row = self.registry.get("shop", subscriber)
        return -1 if row is None else row.level

    def acked(self, subscriber: str) -> int:
        """The level the feed of ``subscriber`` last read an ack for (-1: no feed)."""
        return next((f.acked for f in self.feeds.feeds if f.subscriber == subscriber), -1)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with served_feeds(tmp_path, CountingRegistry) as s:
        yield Served(s.pub, s.registry, s.feeds, s.address)


async def _until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    async def reach() -> None:
        while not check():
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(reach(), timeout)
    except TimeoutError:
        raise AssertionError(f"waited {timeout} s for {what}") from None


async def test_acks_arriving_while_the_registry_is_busy_are_written_once(served: Served) -> None:
    """A hundred acks that arrive while a registry write is held up end in a couple of
    writes of the latest level, not a hundred: the level the registry shows is the
    last acknowledged one, and the subscriber's acks were read meanwhile."""
    sub = await RawSubscriber(served.address, "s1").start()
    try:
        await asyncio.wait_for(sub.in_sync.wait(), 30)
        # One entry first: the feed sends it only after the registry has its in-sync
        # state, so nothing of the feed's own waits on the registry held below.
        served.append(1, start=1000)
        await sub.wait_level(served.pub.log.head)
        with served.registry._lock:  # a slow registry: its writes wait
            for i in range(100):  # one batch, so one ack, each
                served.append(1, start=i)
                await sub.wait_level(served.pub.log.head)
            acked = sub.level
            await _until(lambda: served.acked("s1") == acked, "the feed to read the last ack")
        await _until(lambda: served.level("s1") == acked, "the registry to show the last ack")
        assert served.registry.ack_writes <= 3, served.registry.ack_writes
    finally:
        await sub.close()


async def test_the_last_level_is_recorded_when_the_subscriber_leaves(served: Served) -> None:
    """The registry holds the level of the subscriber's last ack once its feed has ended,
    even when the acks came faster than the registry is written."""
    sub = await RawSubscriber(served.address, "s2").start()
    await asyncio.wait_for(sub.in_sync.wait(), 30)
    for i in range(20):
        served.append(1, start=i)
        await sub.wait_level(served.pub.log.head)
    acked = sub.level
    await _until(lambda: served.acked("s2") == acked, "the feed to read the last ack")
    await sub.close()

    def disconnected() -> bool:
        row = served.registry.get("shop", "s2")
        return row is not None and row.state == "disconnected"

    await _until(disconnected, "the feed to end")
    assert served.level("s2") == acked
