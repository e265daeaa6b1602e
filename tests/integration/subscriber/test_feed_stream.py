"""The subscriber's end of a Sync stream against a real feed: acks and reading (issue 23).

In process: the real FeedManager behind a real gRPC server on port 0
(tests/support/feedserver.py), the subscriber's own FeedStream and Batcher reading
from it; an apply stands in as a task that takes the batcher's batches (in a thread,
as the session's apply thread does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.client import insert_op
from common.latency import StageLatency
from common.rpc import txrepl_pb2 as pb
from publisher import feed as feed_module
from publisher.registry import Registry
from subscriber.batcher import Batcher
from subscriber.config import BatchConfig, SubscriptionConfig
from subscriber.state import SubscriptionState
from subscriber.stream import FeedStream
from tests.support.aiowait import until as _until
from tests.support.feedserver import ServedFeeds, served_feeds


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[ServedFeeds[Registry]]:
    async with served_feeds(tmp_path, Registry) as s:
        yield s


@pytest.fixture
def acks() -> Iterator[list[int]]:
    """The levels the publisher's feeds read from Ack messages, in order."""
    seen: list[int] = []
    original = feed_module.Feed.acknowledge

    def acknowledge(self: feed_module.Feed, level: int) -> None:
        seen.append(level)
        original(self, level)

    feed_module.Feed.acknowledge = acknowledge  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        feed_module.Feed.acknowledge = original  # type: ignore[method-assign]


def _append(served: ServedFeeds[Registry], n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        served.pub.append(pb.Entry(ops=[insert_op("notes", [i, "x"])]))


class Session:
    """A FeedStream in session with its receive loop into a Batcher; ``taken`` gets
    what the stand-in apply took, once ``release`` is set."""

    def __init__(self, stream: FeedStream, state: SubscriptionState, batcher: Batcher) -> None:
        self.stream, self.state, self.batcher = stream, state, batcher
        self.taken: list[int] = []  # seqs gathered, in order
        self.release = asyncio.Event()
        self.release.set()

    async def apply(self) -> None:
        while True:
            await self.release.wait()
            got = await asyncio.to_thread(self.batcher.take)  # as the apply thread does
            if got is None:
                return
            first, payloads, _, _ = got
            self.taken.extend(range(first, first + len(payloads)))


@contextlib.asynccontextmanager
async def session(
    served: ServedFeeds[Registry],
    *,
    ack_interval: float | None = None,
    batch: BatchConfig | None = None,
    stages: StageLatency | None = None,
) -> AsyncIterator[Session]:
    config = SubscriptionConfig(
        publisher="pub1", address=served.address, publication="shop", name="s1"
    )
    interrupted = asyncio.Event()
    more: dict[str, Any] = {} if ack_interval is None else {"ack_interval": ack_interval}
    async with grpc.aio.insecure_channel(served.address) as channel:
        stream = FeedStream(channel, config, interrupted, **more)
        state = SubscriptionState("s1", 0, "")
        await stream.hello("s1", state)
        batcher = Batcher(batch or BatchConfig(), state, interrupted)
        s = Session(stream, state, batcher)
        applier = asyncio.create_task(s.apply())
        receiving = asyncio.create_task(
            stream.receive(state, batcher, applier, lambda: None, stages)
        )
        try:
            yield s
        finally:
            batcher.drop()
            s.release.set()
            await applier
            await receiving  # ends when the apply has: no error, no cancellation
            stream.cancel()


async def test_acks_are_coalesced_and_the_latest_reaches_the_publisher(
    served: ServedFeeds[Registry], acks: list[int]
) -> None:
    """Fifty levels acknowledged back to back reach the publisher as a couple of Ack
    messages, the last of them the latest level, without anything else sent."""
    _append(served, 50)
    async with session(served) as s:
        head = served.pub.log.head
        await _until(lambda: len(s.taken) == head, "every entry gathered")
        for level in range(1, head + 1):
            await s.stream.ack(level)
        await _until(lambda: bool(acks) and acks[-1] == head, "the publisher to read the last ack")
        assert len(acks) <= 5, acks
        assert acks == sorted(acks)


async def test_a_waiting_ack_is_sent_when_the_session_ends(
    served: ServedFeeds[Registry], acks: list[int]
) -> None:
    """With an ack interval of an hour, the levels acknowledged after the first wait for
    it; flush_acks (the pipeline's end) sends the latest at once."""
    _append(served, 10)
    async with session(served, ack_interval=3600) as s:
        head = served.pub.log.head
        await _until(lambda: len(s.taken) == head, "every entry gathered")
        await s.stream.ack(1)
        await _until(lambda: acks == [1], "the first ack")
        for level in range(2, head + 1):
            await s.stream.ack(level)
        await s.stream.flush_acks()
        await _until(lambda: acks[-1] == head, "the publisher to read the flushed ack")
        assert acks == [1, head]


async def test_an_ack_never_holds_up_the_apply(
    served: ServedFeeds[Registry], acks: list[int]
) -> None:
    """The apply's ack returns without waiting for the gRPC write (the first ack of a
    session, written at once, as much as a coalesced one): the next batch is not held
    up behind a write's round trip; the level still reaches the publisher."""
    _append(served, 3)
    async with session(served, ack_interval=0) as s:
        head = served.pub.log.head
        await _until(lambda: len(s.taken) == head, "every entry gathered")
        for level in range(1, head + 1):
            step = s.stream.ack(level)
            # Run by hand: a coroutine that awaits the write suspends on its first step.
            with pytest.raises(StopIteration):
                step.send(None)
            want = [level]
            await _until(lambda: acks[-1:] == want, f"the publisher to read ack {level}")  # noqa: B023
        assert acks == list(range(1, head + 1))


async def test_reading_makes_no_task_per_message(served: ServedFeeds[Registry]) -> None:
    """Forty entries sent one message each are read without a task per message (each
    task is a wake-up of the event loop and costs more than the read)."""
    created = 0
    loop = asyncio.get_running_loop()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        nonlocal created
        created += 1
        return asyncio.Task(coro, loop=loop, **kw)

    async with session(served) as s:
        await _until(lambda: s.state.in_sync_head is not None, "in sync")
        loop.set_task_factory(factory)
        try:
            for i in range(40):
                _append(served, 1, start=i)
                await _until(lambda: len(s.taken) == served.pub.log.head, f"entry {i} gathered")
        finally:
            loop.set_task_factory(None)
    assert s.taken == list(range(1, served.pub.log.head + 1))
    assert created < 10, created


async def test_a_full_batcher_stops_the_reading(served: ServedFeeds[Registry]) -> None:
    """While the apply takes nothing, the stream reads only what fits in the batcher:
    of twenty messages, the one the idle apply's gather takes as it parks, one queued
    item, one waiting for room and the one in hand.  Once it takes again, every entry
    arrives once and in order."""
    stages = StageLatency("txrepl_subscription_stage_seconds", "subscription")
    one = BatchConfig(max_entries=1, queue_batches=1)
    async with session(served, batch=one, stages=stages) as s:
        await _until(lambda: s.state.in_sync_head is not None, "in sync")
        start = served.pub.log.head
        before = stages.count("s1", "receive")
        s.release.clear()
        await asyncio.sleep(0.05)  # the apply is now parked on release
        feed = next(iter(served.feeds.feeds))
        for i in range(20):  # one message each: sent before the next is appended
            _append(served, 1, start=i)
            await _until(lambda: feed.last_sent == served.pub.log.head, f"the send of {i}")
        head = served.pub.log.head
        await asyncio.sleep(0.5)  # room for a reader that would not stop to go on
        read = stages.count("s1", "receive") - before
        assert read <= 4, read
        s.release.set()
        await _until(lambda: len(s.taken) == head, "every entry gathered")
        assert s.taken == list(range(1, head + 1))
        assert stages.count("s1", "receive") - before == head - start
