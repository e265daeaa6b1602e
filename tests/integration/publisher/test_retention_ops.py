"""A log nobody can pin forever: retention enforces max_delta on vanished subscribers,
and operators can drop or invalidate a subscriber from the command line."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from tests.support.feedclient import RawSubscriber
from tests.support.harness import Pair, wait_until
from tests.support.padded_rows import insert_padded

MAX_DELTA = 5


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    pair = Pair(
        tmp_path,
        tables=["t"],
        publisher_extra={"retention_interval_s": 0.2, "log": {"segment_bytes": 4096}},
        publication_extra={"max_delta": MAX_DELTA},
    )
    conn = sqlite3.connect(str(pair.source_path), isolation_level=None)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.close()
    pair.start_publisher()
    try:
        yield pair
    finally:
        pair.stop()


def _publication(pair: Pair) -> pb.PublicationInfo:
    assert pair.pub is not None
    with grpc.insecure_channel(pair.pub.address) as ch:
        resp = rpc.AdminStub(ch).ListPublications(pb.ListPublicationsRequest(), timeout=10)
    return next(p for p in resp.publications if p.name == "shop")


def _subscriber(pair: Pair, name: str) -> pb.SubscriberInfo | None:
    assert pair.pub is not None
    with grpc.insecure_channel(pair.pub.address) as ch:
        resp = rpc.AdminStub(ch).ListSubscribers(pb.ListSubscribersRequest(), timeout=10)
    return next((s for s in resp.subscribers if s.subscriber == name), None)


async def test_vanished_subscriber_is_invalidated_by_retention_and_the_log_shrinks(
    pair: Pair,
) -> None:
    """A subscriber that synced once and went away no longer pins the log: once the head
    runs more than max_delta past its level, retention marks it invalid (an error line
    naming publication, subscriber, level and head) and purges the segments it held."""
    assert pair.pub is not None
    head0 = _publication(pair).head
    insert_padded(pair.source_path, 0, 1)
    wait_until(lambda: _publication(pair).head > head0, 30, "capture")
    ghost = await RawSubscriber(pair.pub.address, "ghost").start()
    level = _publication(pair).head
    await ghost.wait_level(level)

    def acked() -> bool:  # the ack is recorded, not only the entries received
        row = _subscriber(pair, "ghost")
        return row is not None and row.level >= level

    # In a thread: the ghost's ack is written by this event loop, which a blocking
    # wait here would stall (the flake of the previous fix).
    await asyncio.to_thread(wait_until, acked, 10, "the registry row at the ghost's level")
    await ghost.close()

    insert_padded(pair.source_path, 100, 40)  # ~80 KiB in 4 KiB segments; far past max_delta
    wait_until(lambda: _publication(pair).head > level + 3 * MAX_DELTA, 60, "capture")

    wait_until(lambda: _publication(pair).first_retained > level, 30, "retention to purge")
    after = _publication(pair)
    assert after.log_bytes < 40 * 2000 / 2  # most of what was written is gone
    ghost_row = _subscriber(pair, "ghost")
    assert ghost_row is not None
    assert not ghost_row.valid
    lines = [
        line
        for line in pair.pub.log_path.read_text().splitlines()
        if "retention invalidated a subscriber" in line
    ]
    assert len(lines) == 1
    line = lines[0]
    for part in ('"level": "error"', '"shop"', '"ghost"', f'"sync_level": {level}', '"head": '):
        assert part in line, (part, line)
