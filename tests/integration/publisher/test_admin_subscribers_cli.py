"""`txrepl admin drop-subscriber` and `txrepl admin invalidate`, run as the installed
command against a real publisher with tokens: a vanished subscriber stops pinning the
log, refusals (no token, a subscriber's token, unknown names, a connected subscriber)
are one line and change nothing."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import hash_token
from tests.support.feedclient import RawSubscriber
from tests.support.harness import Pair, wait_until
from tests.support.padded_rows import insert_padded

ADMIN = "admin-token-0123456789"
GHOST = "ghost-token-0123456789"
CURRENT = "current-token-0123456789"
TXREPL = str(Path(sys.executable).parent / "txrepl")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    """A publisher with an admin token and two subscriber grants; retention
    every 0.2 s over 4 KiB segments, max_delta far away (only an operator unpins)."""
    pair = Pair(
        tmp_path,
        tables=["t"],
        publisher_extra={
            "retention_interval_s": 0.2,
            "log": {"segment_bytes": 4096},
            "auth": {"admin_token_hashes": [hash_token(ADMIN)]},
            "subscriber": [
                {"name": "ghost", "token_hash": hash_token(GHOST), "publications": ["shop"]},
                {"name": "current", "token_hash": hash_token(CURRENT), "publications": ["*"]},
            ],
        },
    )
    conn = sqlite3.connect(str(pair.source_path), isolation_level=None)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.close()
    (tmp_path / "admin.token").write_text(ADMIN + "\n")
    (tmp_path / "ghost.token").write_text(GHOST + "\n")
    pair.start_publisher()
    try:
        yield pair
    finally:
        pair.stop()


def _admin(pair: Pair) -> tuple[grpc.Channel, rpc.AdminStub]:
    assert pair.pub is not None
    ch = grpc.insecure_channel(pair.pub.address)
    return ch, rpc.AdminStub(ch)


MD = (("x-txrepl-token", ADMIN),)


def _publication(pair: Pair) -> pb.PublicationInfo:
    ch, admin = _admin(pair)
    with ch:
        resp = admin.ListPublications(pb.ListPublicationsRequest(), timeout=10, metadata=MD)
    return next(p for p in resp.publications if p.name == "shop")


def _subscriber(pair: Pair, name: str) -> pb.SubscriberInfo | None:
    ch, admin = _admin(pair)
    with ch:
        resp = admin.ListSubscribers(pb.ListSubscribersRequest(), timeout=10, metadata=MD)
    return next((s for s in resp.subscribers if s.subscriber == name), None)


def _cli(pair: Pair, *argv: str, token: str = "admin") -> subprocess.CompletedProcess[str]:
    """``txrepl admin ARGV --publisher H:P [--token-file <token>.token]``."""
    assert pair.pub is not None
    args = [TXREPL, "admin", *argv, "--publisher", pair.pub.address]
    if token:
        args += ["--token-file", str(pair.workdir / f"{token}.token")]
    env = {k: v for k, v in os.environ.items() if k != "TXREPL_TOKEN"}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)


async def _synced(pair: Pair, name: str, token: str) -> int:
    """``name`` syncs to the head, its ack is recorded, it goes away; returns its level."""
    assert pair.pub is not None
    sub = await RawSubscriber(pair.pub.address, name, token=token).start()
    level = _publication(pair).head
    await sub.wait_level(level)

    def acked() -> bool:
        row = _subscriber(pair, name)
        return row is not None and row.level >= level

    # In a thread: the subscriber's acks are written by this event loop.
    await asyncio.to_thread(wait_until, acked, 10, f"{name}'s ack in the registry")
    await sub.close()

    def gone() -> bool:
        row = _subscriber(pair, name)
        return row is not None and row.state == "disconnected"

    wait_until(gone, 10, f"{name} disconnected")
    return level


def _captured(pair: Pair, least: int) -> None:
    """Wait until the head is at least ``least`` and has stopped moving (capture may
    put several inserts in one entry, so the count of entries is not known)."""
    last = -1

    def settled() -> bool:
        nonlocal last
        head, last = last, _publication(pair).head
        return head == last >= least

    wait_until(settled, 60, "capture to settle", interval=0.5)


async def _ghost_synced_then_gone(pair: Pair) -> int:
    """The ghost syncs once and goes away; the head runs on (about 80 KiB in 4 KiB
    segments) and another subscriber ("current") syncs to it.  Returns the ghost's level.
    (A publication whose every subscriber was dropped is one nobody has synced: it keeps
    its log for a new subscriber, docs/operations.md.)"""
    insert_padded(pair.source_path, 0, 1)
    wait_until(lambda: _publication(pair).head >= 1, 30, "capture")
    level = await _synced(pair, "ghost", GHOST)
    insert_padded(pair.source_path, 100, 40)
    _captured(pair, level + 10)
    await _synced(pair, "current", CURRENT)
    time.sleep(1.0)  # several retention passes
    assert _publication(pair).first_retained <= level + 1, "the ghost pins the log"
    return level


def _row(pair: Pair) -> tuple[int, bool, str, str]:
    """The ghost's level, validity, state and reason (lag_seconds moves with the clock)."""
    row = _subscriber(pair, "ghost")
    assert row is not None
    return int(row.level), row.valid, row.state, row.last_cut_reason


def _refusals_change_nothing(pair: Pair, *argv: str) -> None:
    """``argv`` refused without a token, with a subscriber's token, for an unknown
    subscriber and an unknown publication: exit 1, one line, the row untouched."""
    before = _row(pair)
    first = _publication(pair).first_retained
    no_token = _cli(pair, *argv, token="")
    assert no_token.returncode == 1
    assert no_token.stderr.startswith("txrepl: UNAUTHENTICATED: ")
    assert no_token.stderr.count("\n") == 1
    wrong_role = _cli(pair, *argv, token="ghost")
    assert wrong_role.returncode == 1
    assert wrong_role.stderr.startswith("txrepl: PERMISSION_DENIED: "), wrong_role.stderr
    unknown = _cli(pair, *argv[:2], "nobody")
    assert unknown.returncode == 1
    assert unknown.stderr == (
        "txrepl: NOT_FOUND: subscriber 'nobody' has never synced 'shop' "
        "(subscribers of 'shop': current, ghost)\n"
    )
    no_pub = _cli(pair, argv[0], "nope", "ghost")
    assert no_pub.returncode == 1
    assert no_pub.stderr == "txrepl: NOT_FOUND: publication 'nope' not found (known: shop)\n"
    time.sleep(0.6)  # retention passes: still pinned
    assert _row(pair) == before
    assert _publication(pair).first_retained == first


async def test_drop_subscriber_unpins_the_log(pair: Pair) -> None:
    """A subscriber that vanished holds the log until `txrepl admin drop-subscriber`
    removes its row; then retention purges what it held.  Without the admin token,
    with the subscriber's own token, or for unknown names the command is refused in
    one line and changes nothing."""
    level = await _ghost_synced_then_gone(pair)
    _refusals_change_nothing(pair, "drop-subscriber", "shop", "ghost")

    out = _cli(pair, "drop-subscriber", "shop", "ghost", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["subscriber"]["subscriber"] == "ghost"
    assert doc["subscriber"]["level"] == level  # a number, the level it had
    assert _subscriber(pair, "ghost") is None
    wait_until(lambda: _publication(pair).first_retained > level + 1, 30, "retention to purge")
    assert _publication(pair).log_bytes < 40 * 2000 / 2
    again = _cli(pair, "drop-subscriber", "shop", "ghost")
    assert again.returncode == 1
    assert "subscriber 'ghost' has never synced 'shop'" in again.stderr


async def test_invalidate_unpins_the_log_and_the_subscriber_needs_a_reinit(pair: Pair) -> None:
    """`txrepl admin invalidate` marks the vanished subscriber invalid (with the reason
    given), retention purges what it held, and when it comes back it is refused: it
    needs a reinit.  Refusals as for drop-subscriber."""
    assert pair.pub is not None
    level = await _ghost_synced_then_gone(pair)
    _refusals_change_nothing(pair, "invalidate", "shop", "ghost")

    out = _cli(pair, "invalidate", "shop", "ghost", "--reason", "host decommissioned")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"ghost on shop: invalid at level {level};")
    row = _subscriber(pair, "ghost")
    assert row is not None
    assert not row.valid
    assert row.last_cut_reason == "invalidated by an operator: host decommissioned"
    wait_until(lambda: _publication(pair).first_retained > level + 1, 30, "retention to purge")

    back = await RawSubscriber(pair.pub.address, "ghost", token=GHOST, level=level).start()
    code, details = await back.wait_ended()
    await back.close()
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "invalidated by an operator: host decommissioned" in details
    assert "re-initialise" in details


async def test_a_connected_subscriber_is_neither_dropped_nor_invalidated(pair: Pair) -> None:
    """While the subscriber's feed is live both commands are refused (stop or pause it
    first), naming it; its row stays valid."""
    assert pair.pub is not None
    insert_padded(pair.source_path, 0, 1)
    wait_until(lambda: _publication(pair).head >= 1, 30, "capture")
    ghost = await RawSubscriber(pair.pub.address, "ghost", token=GHOST).start()
    try:
        await ghost.wait_level(_publication(pair).head)
        for argv in (("drop-subscriber", "shop", "ghost"), ("invalidate", "shop", "ghost")):
            out = await asyncio.to_thread(_cli, pair, *argv)
            assert out.returncode == 1
            assert out.stderr.startswith(
                "txrepl: FAILED_PRECONDITION: subscriber 'ghost' is connected to 'shop' now"
            ), out.stderr
        row = _subscriber(pair, "ghost")
        assert row is not None
        assert row.valid
    finally:
        await ghost.close()
