"""An in-sync feed's waits for the head (publisher/feed.py on publisher/log/_watch.py):
heartbeats while idle, each new entry as soon as it is durable, the cut at shutdown.

In process: a real log and registry (SQLite files), the real FeedManager behind a
real gRPC server on port 0, a raw subscriber that acknowledges every batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from common.client import insert_op
from common.feedstatus import cut_kind
from common.rpc import txrepl_pb2 as pb
from publisher.registry import Registry
from tests.support.feedclient import RawSubscriber
from tests.support.feedserver import served_feeds


async def _reach(check: Callable[[], bool], what: str) -> None:
    async def reach() -> None:
        while not check():
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(reach(), 60)
    except TimeoutError:
        raise AssertionError(f"waited 60 s for {what}") from None


async def test_an_idle_feed_sends_heartbeats_then_each_new_entry_as_it_comes(
    tmp_path: Path,
) -> None:
    """While nothing is appended the feed sends heartbeats carrying the head; each
    entry appended then reaches the subscriber, one after the other."""
    async with served_feeds(tmp_path, Registry, heartbeat_s=0.1) as served:
        sub = await RawSubscriber(served.address, "s1").start()
        try:
            await asyncio.wait_for(sub.in_sync.wait(), 60)
            head = served.pub.log.head
            await _reach(lambda: len(sub.heartbeats) >= 3, "three heartbeats")
            assert set(sub.heartbeats) == {head}
            sent = []
            for i in range(5):
                entry = pb.Entry(ops=[insert_op("notes", [i, "x"])])
                seq = await asyncio.to_thread(served.pub.append, entry)
                await sub.wait_level(seq, 60)
                (stored,) = served.pub.log.read(seq, max_entries=1)
                sent.append(stored)
            assert sub.received[-5:] == sent
            assert sub.level == head + 5
        finally:
            await sub.close()


async def test_a_feed_waiting_at_the_head_is_cut_at_shutdown(tmp_path: Path) -> None:
    """A feed waiting for new entries (its heartbeat ten minutes away) ends at once
    when the publisher shuts down, with the cut's status and kind."""
    async with served_feeds(tmp_path, Registry, heartbeat_s=600) as served:
        sub = await RawSubscriber(served.address, "s1").start()
        try:
            await asyncio.wait_for(sub.in_sync.wait(), 60)
            await _reach(lambda: bool(served.feeds._waits), "the feed to wait for the head")
            served.feeds.stopping.set()
            code, details = await sub.wait_ended(60)
            assert code == grpc.StatusCode.ABORTED, details
            assert "publisher shutting down" in details
            assert cut_kind(sub.trailing) == pb.CUT_KIND_PUBLISHER_SHUTTING_DOWN
        finally:
            await sub.close()


async def test_while_capture_reads_a_backlog_a_feed_is_neither_in_sync_nor_cut(
    tmp_path: Path,
) -> None:
    """While capture reads a backlog (the head moving at capture's pace, not live) a
    feed at the head stays syncing and is not cut for its queue, though it trails the
    head by more than the threshold; it goes in sync once the backlog is read and its
    acks are within the threshold."""
    async with served_feeds(tmp_path, Registry, queue_threshold=5) as served:
        pub = served.pub
        pub.catching_up = True  # as PostgreSQL capture says while reading a backlog
        sub = await RawSubscriber(served.address, "s1", ack=False).start()
        try:
            await sub.wait_level(pub.log.head, 60)
            for i in range(10):  # the backlog goes on; nothing is acknowledged
                await asyncio.to_thread(pub.append, pb.Entry(ops=[insert_op("notes", [i, "x"])]))
            await sub.wait_level(pub.log.head, 60)  # fed all along, not cut
            assert not sub.in_sync.is_set()
            sub.ack = True
            seq = await asyncio.to_thread(pub.append, pb.Entry(ops=[insert_op("notes", [99, "y"])]))
            await sub.wait_level(seq, 60)  # and acknowledged: within the threshold now
            pub.catching_up = False  # the backlog read: the head is live again
            await asyncio.wait_for(sub.in_sync.wait(), 60)
            assert sub.code is None
            row = served.registry.get(pub.name, "s1")
            assert row is not None
            assert row.cuts == 0
        finally:
            await sub.close()


async def test_an_in_sync_feed_arms_one_timer_for_its_waits_not_one_per_entry(
    tmp_path: Path,
) -> None:
    """Entries sent one at a time (each acknowledged before the next: a wait for the
    head each) arm the heartbeat's timer a few times, not once per entry (issue 23:
    the event loop's work per entry); and once they stop, the idle feed still sends
    heartbeats carrying the new head."""
    loop = asyncio.get_running_loop()
    long_timers = 0
    call_at = loop.call_at

    def counting_call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        nonlocal long_timers
        if 0.5 < when - loop.time() <= 0.8:  # the heartbeat (not the polls, the 60 s limits)
            long_timers += 1
        return call_at(when, *args, **kwargs)

    async with served_feeds(tmp_path, Registry, heartbeat_s=0.8) as served:
        sub = await RawSubscriber(served.address, "s1").start()
        try:
            await asyncio.wait_for(sub.in_sync.wait(), 60)
            loop.call_at = counting_call_at  # type: ignore[method-assign,assignment]
            for i in range(100):
                entry = pb.Entry(ops=[insert_op("notes", [i, "x"])])
                seq = await asyncio.to_thread(served.pub.append, entry)
                await sub.wait_level(seq, 60)
            armed = long_timers
            beats = len(sub.heartbeats)
            await _reach(lambda: len(sub.heartbeats) >= beats + 2, "two heartbeats after")
            assert set(sub.heartbeats[beats:]) == {seq}
        finally:
            del loop.call_at
            await sub.close()
    # One per heartbeat period the entries took (a loaded machine: many), not 100.
    assert armed < 50, armed
