"""Feeds, levels and the slow-feed policy against a real publisher process over loopback gRPC."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from common.client import PublishClient, insert_op, schema_op
from common.feedstatus import cut_kind, refusal_kind
from common.rpc import txrepl_pb2 as pb
from tests.support.feedclient import RawSubscriber
from tests.support.harness import Daemon, publication_head, publisher_admin, to_toml
from tests.support.ledger import LEDGER_COLUMNS, ledger_source, ledger_txns

MAX_DELTA = 50
THRESHOLD = 30


@dataclass
class Pub:
    daemon: Daemon
    address: str
    source: Path

    def head(self, publication: str = "shop") -> int:
        return publication_head(self.address, publication)

    def subscribers(self) -> dict[str, pb.SubscriberInfo]:
        resp = publisher_admin(self.address).ListSubscribers(pb.ListSubscribersRequest())
        return {s.subscriber: s for s in resp.subscribers}

    def publish(self, publication: str, count: int, size: int = 10, start: int = 0) -> int:
        """Publish ``count`` entries (one insert each) through the Publish RPC; returns the head."""
        seq = 0
        with PublishClient(self.address) as client:
            if start == 0:
                client.publish(
                    publication, [schema_op("notes", [("id", "integer"), ("body", "text")], ["id"])]
                )
            for i in range(start, start + count):
                seq = client.publish(publication, [insert_op("notes", [i, "x" * size])])
        return seq


@pytest.fixture
def pub(tmp_path: Path) -> Iterator[Pub]:
    src = ledger_source(tmp_path / "source.db")
    src.close()
    cfg = {
        "server_name": "pub1",
        "listen": "127.0.0.1:0",
        "data_dir": str(tmp_path / "publisher"),
        "source": f"sqlite:///{tmp_path / 'source.db'}",
        "poll_interval_ms": 2,
        "publication": [
            {
                "name": "shop",
                "tables": ["counter", "ledger"],
                "max_delta": MAX_DELTA,
                "queue_threshold": THRESHOLD,
                "heartbeat_s": 0.5,
            },
            {
                # The same tables without a tight threshold: for feeds that must not be
                # cut while a busy test process falls behind on acks.
                "name": "wide",
                "tables": ["counter", "ledger"],
                "heartbeat_s": 0.5,
            },
            {
                "name": "bulk",
                "tables": [],
                "queue_threshold": 1_000_000,
                "send_timeout_s": 1.0,
                "heartbeat_s": 0.5,
            },
        ],
    }
    path = tmp_path / "publisher.toml"
    path.write_text(to_toml(cfg))
    d = Daemon(
        "publisher", path, tmp_path / "publisher" / "publisher.addr", tmp_path / "publisher.log"
    ).start()
    try:
        yield Pub(d, d.address, tmp_path / "source.db")
    finally:
        d.stop()


async def test_refusals_have_distinct_statuses_and_other_feeds_keep_flowing(pub: Pub) -> None:
    """Unknown publication, wrong incarnation, ahead of head, bad Hello: each refused clearly."""
    pub.publish("shop", 5)
    good = await RawSubscriber(pub.address, "good").start()
    await good.in_sync.wait()
    assert good.welcome is not None
    incarnation = good.welcome.incarnation
    head = pub.head()

    kinds = []  # each refusal's RefusalKind, from the trailing metadata

    async def refused(sub: RawSubscriber, first: pb.SubscriberMessage | None = None) -> tuple:
        await sub.start(first)
        code, details = await sub.wait_ended()
        await sub.close()
        kinds.append(refusal_kind(sub.trailing))
        return code, details

    code, details = await refused(RawSubscriber(pub.address, "s1", publication="nosuch"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "publication 'nosuch' not found" in details
    code, details = await refused(RawSubscriber(pub.address, "s2", incarnation="not-the-id"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert incarnation in details
    assert "not-the-id" in details
    code, details = await refused(RawSubscriber(pub.address, "s3", level=head + 5))
    assert code == grpc.StatusCode.OUT_OF_RANGE
    assert f"level {head + 5} is ahead" in details
    ack_first = pb.SubscriberMessage()
    ack_first.ack.level = 1
    code, details = await refused(RawSubscriber(pub.address, "s4"), ack_first)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be a Hello" in details
    code, _ = await refused(RawSubscriber(pub.address, "s5", publisher="pub2"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert kinds == [
        pb.REFUSAL_KIND_UNKNOWN_PUBLICATION,
        pb.REFUSAL_KIND_INCARNATION_CHANGED,
        pb.REFUSAL_KIND_AHEAD_OF_HEAD,
        pb.REFUSAL_KIND_MALFORMED,
        pb.REFUSAL_KIND_WRONG_PUBLISHER,
    ]

    # The good feed kept flowing all along.
    new_head = pub.publish("shop", 5, start=100)
    await good.wait_level(new_head)
    assert good.code is None
    # Refused requests changed nothing in the registry.
    assert set(pub.subscribers()) == {"good"}
    await good.close()


async def test_max_delta_marks_invalid_until_mark_valid(pub: Pub) -> None:
    """Beyond max_delta: invalid, refused on retries, syncs after mark-valid."""
    head = pub.publish("shop", MAX_DELTA + 10)
    lagger = RawSubscriber(pub.address, "lagger")
    await lagger.start()
    code, details = await lagger.wait_ended()
    await lagger.close()
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "subscriber is invalid" in details
    assert "max_delta" in details
    assert refusal_kind(lagger.trailing) == pb.REFUSAL_KIND_INVALID
    info = pub.subscribers()["lagger"]
    assert not info.valid
    assert info.state == "invalid"

    # Refused on retries, even from a level within max_delta.
    retry = RawSubscriber(pub.address, "lagger", level=head - 5)
    await retry.start()
    code, _ = await retry.wait_ended()
    await retry.close()
    assert code == grpc.StatusCode.FAILED_PRECONDITION

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "common.cli",
            "admin",
            "--publisher",
            pub.address,
            "mark-valid",
            "shop",
            "lagger",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "valid" in out.stdout

    again = RawSubscriber(pub.address, "lagger")
    await again.start()
    await again.wait_level(head)
    await asyncio.wait_for(again.in_sync.wait(), 10)
    assert pub.subscribers()["lagger"].valid
    await again.close()


async def test_in_sync_feed_that_does_not_ack_is_cut_by_queue_threshold(pub: Pub) -> None:
    """An in-sync subscriber that applies nothing is cut once the threshold is passed."""
    pub.publish("shop", 3)
    slow = RawSubscriber(pub.address, "slow", ack=False)
    await slow.start()
    await asyncio.wait_for(slow.in_sync.wait(), 10)
    await asyncio.to_thread(pub.publish, "shop", THRESHOLD + 10, 10, 100)
    code, details = await slow.wait_ended()
    await slow.close()
    assert code == grpc.StatusCode.ABORTED
    assert "queue threshold" in details
    assert cut_kind(slow.trailing) == pb.CUT_KIND_QUEUE_THRESHOLD
    info = pub.subscribers()["slow"]
    assert info.cuts == 1
    assert "queue threshold" in info.last_cut_reason
    # Nothing lost: it resumes from its level.
    resumed = RawSubscriber(pub.address, "slow", incarnation=slow.incarnation)
    await resumed.start()
    await resumed.wait_level(pub.head())
    await resumed.close()


async def test_feed_at_the_head_but_far_from_applied_stays_syncing_and_is_not_cut(
    pub: Pub,
) -> None:
    """A subscriber sent the whole log but more than the threshold behind in applying it
    (a restart while capture catches up) is not cut for its queue: it is sent the new
    entries as they come, and goes in sync once its acks bring it within."""
    pub.publish("shop", THRESHOLD + 10)
    behind = RawSubscriber(pub.address, "behind", ack=False)
    await behind.start()
    await behind.wait_level(pub.head())  # sent everything, applied (acked) nothing
    head = await asyncio.to_thread(pub.publish, "shop", 5, 10, 100)
    await behind.wait_level(head)  # not cut: still fed
    assert not behind.in_sync.is_set()
    assert behind.code is None
    behind.ack = True  # acks from its next batch on
    head = await asyncio.to_thread(pub.publish, "shop", 1, 10, 200)
    await behind.wait_level(head)
    await asyncio.wait_for(behind.in_sync.wait(), 10)
    assert behind.code is None

    async def recorded() -> None:  # the registry's state follows the InSync message
        while pub.subscribers()["behind"].state != "in_sync":
            await asyncio.sleep(0.05)

    await asyncio.wait_for(recorded(), 30)
    assert pub.subscribers()["behind"].cuts == 0
    await behind.close()


async def test_subscriber_that_stops_reading_is_cut_by_send_timeout(pub: Pub) -> None:
    """A feed whose sends block longer than send_timeout_s is cut with that reason."""
    stuck = RawSubscriber(pub.address, "stuck", publication="bulk")
    await stuck.start()
    await asyncio.wait_for(stuck.in_sync.wait(), 10)
    stuck.read = False
    # 48 MiB in 1 MiB entries: far beyond what HTTP/2 flow control lets the publisher buffer.
    await asyncio.to_thread(pub.publish, "bulk", 48, 1 << 20)

    async def cut() -> None:
        while "send timeout" not in pub.subscribers()["stuck"].last_cut_reason:
            await asyncio.sleep(0.2)

    await asyncio.wait_for(cut(), 30)
    assert pub.subscribers()["stuck"].cuts == 1
    await stuck.close()


async def test_twenty_subscribers_in_sync_converge(pub: Pub) -> None:
    """20 feeds on one publication, live traffic: every subscriber ends with the source's rows."""
    src = ledger_source(pub.source)
    ledger_txns(src, 1, 50)
    subs = [RawSubscriber(pub.address, f"s{i:02d}", publication="wide") for i in range(20)]
    for s in subs:
        await s.start()
    await asyncio.gather(*(asyncio.wait_for(s.in_sync.wait(), 30) for s in subs))

    def live_traffic() -> None:  # in a thread, so the feeds keep reading and acking
        conn = ledger_source(pub.source)
        try:
            ledger_txns(conn, 51, 300)
        finally:
            conn.close()

    await asyncio.to_thread(live_traffic)

    # Wait for capture to take everything, then for every feed to reach the head.
    async def captured() -> None:
        while src.execute("SELECT count(*) FROM _txrepl_capture").fetchone()[0]:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(captured(), 30)
    head = pub.head("wide")
    await asyncio.gather(*(s.wait_level(head, 60) for s in subs))
    expected = {
        t: sorted(src.execute(f"SELECT {', '.join(c)} FROM {t}").fetchall())
        for t, c in LEDGER_COLUMNS.items()
    }
    for s in subs:
        snap = s.target.snapshot()
        got = {t: [tuple(r[: len(c)]) for r in snap[t]] for t, c in LEDGER_COLUMNS.items()}
        # amounts travel as exact decimals; compare as text with two places
        for rows in (got["ledger"], expected["ledger"]):
            rows[:] = [(r[0], r[1], f"{float(str(r[2])):.2f}", r[3]) for r in rows]
        assert got == expected, s.name

    # The registry records each feed's acked level (asynchronously, shortly after the ack).
    async def recorded() -> None:
        while not all(i.level == head for i in pub.subscribers().values()):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(recorded(), 10)
    assert len(pub.subscribers()) == 20
    for s in subs:
        await s.close()


async def test_malformed_and_oversized_requests_get_invalid_argument(pub: Pub) -> None:
    """Bytes that do not parse, and absurdly long names: INVALID_ARGUMENT, nothing changes."""
    head = pub.head()
    async with grpc.aio.insecure_channel(pub.address) as ch:
        ident = lambda b: b  # noqa: E731 - raw bytes through, both ways
        sync = ch.stream_stream(
            "/txrepl.v1.Replication/Sync", request_serializer=ident, response_deserializer=ident
        )
        call = sync()
        await call.write(b"\xff\xff\xff\xff garbage")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed request message" in (err.value.details() or "")
        publish = ch.unary_unary(
            "/txrepl.v1.Replication/Publish", request_serializer=ident, response_deserializer=ident
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await publish(b"\x0a\xff\xff\xff\xff\x0f")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    long_name = RawSubscriber(pub.address, "x", publication="p" * 10_000)
    await long_name.start()
    code, details = await long_name.wait_ended()
    await long_name.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "10000 characters long" in details
    assert pub.head() == head
    assert pub.subscribers() == {}


class HeldApplier:
    """A real applier whose next apply can be held, to stand for a slow target."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []
        self.ahead: list[bool] = []  # per apply: written with a plan made ahead
        self.hold = False
        self.gate = threading.Event()

    def load_state(self) -> Any:
        return self.inner.load_state()

    def read_target_node(self) -> str:
        return str(self.inner.read_target_node())

    @property
    def target_node(self) -> str:
        return str(self.inner.target_node)

    def plan(self, first_seq: int, entries: list[pb.Entry], **kw: Any) -> Any:
        return self.inner.plan(first_seq, entries, **kw)

    def apply(
        self, first_seq: int, entries: list[pb.Entry], *, incarnation: str, planned: Any = None
    ) -> Any:
        self.sizes.append(len(entries))
        if self.hold:
            self.hold = False
            self.gate.wait(60)
        result = self.inner.apply(first_seq, entries, incarnation=incarnation, planned=planned)
        self.ahead.append(result.planned_ahead)
        return result


def bulk_runner(
    pub: Pub, spark: Any, tmp_path: Path, batch: Any, backlog: int = 1
) -> tuple[Any, HeldApplier, asyncio.Task[None]]:
    """A running subscription to "bulk" (``backlog`` entries published first) through a
    HeldApplier."""
    from common.backoff import Backoff
    from subscriber.apply import Applier
    from subscriber.config import SubscriptionConfig
    from subscriber.subscription import SubscriptionRunner
    from subscriber.targets.sqlite import SqliteWriter

    pub.publish("bulk", backlog)
    config = SubscriptionConfig(publisher="pub1", address=pub.address, publication="bulk")
    held = HeldApplier(Applier(spark, SqliteWriter(str(tmp_path / "target.db")), config.id))
    runner = SubscriptionRunner(config, "bulk-sub", cast(Any, held), batch=batch, backoff=Backoff())
    return runner, held, asyncio.create_task(runner.run())


@pytest.mark.spark
async def test_entries_arriving_during_a_slow_apply_are_applied_together(
    pub: Pub, spark: Any, tmp_path: Path
) -> None:
    """In sync, 300 entries committed while an apply is busy go into a few large batches."""
    from subscriber.config import BatchConfig

    # A queue of two received batches: without coalescing an apply would get at most
    # three of the one-entry batches the publisher sends in sync.
    runner, held, task = bulk_runner(
        pub, spark, tmp_path, BatchConfig(max_entries=10_000, queue_batches=2)
    )
    try:

        async def level(seq: int, what: str) -> None:
            async def reached() -> None:
                while runner.level < seq or runner.state != "in_sync":
                    await asyncio.sleep(0.05)

            try:
                await asyncio.wait_for(reached(), 120)
            except TimeoutError:
                raise AssertionError(f"{what}: level {runner.level}, {runner.state}") from None

        await level(pub.head("bulk"), "caught up")
        held.hold = True
        start = len(held.sizes)
        head = await asyncio.to_thread(pub.publish, "bulk", 1, 10, 1)  # held in apply
        head = await asyncio.to_thread(pub.publish, "bulk", 300, 10, 2)

        async def received() -> None:
            while runner.head < head:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(received(), 60)
        held.gate.set()
        await level(head, "applied")
        after = held.sizes[start:]
        assert sum(after) == 301, after
        assert len(after) <= 5, f"{len(after)} applies for 301 entries: {after}"
    finally:
        held.gate.set()
        runner.stop()
        await asyncio.wait_for(task, 60)


@pytest.mark.spark
@pytest.mark.parametrize("plan_ahead", [True, False], ids=["plan-ahead", "off"])
async def test_a_catch_up_plans_each_batch_while_the_one_before_is_written(
    pub: Pub, spark: Any, tmp_path: Path, plan_ahead: bool
) -> None:
    """Syncing, batch n+1 is taken and planned while batch n is written; the target
    ends exactly as published; with plan_ahead off no batch is planned ahead."""
    from subscriber.config import BatchConfig

    batch = BatchConfig(max_entries=40, queue_batches=2, plan_ahead=plan_ahead)
    runner, held, task = bulk_runner(pub, spark, tmp_path, batch, backlog=600)
    try:
        head = pub.head("bulk")

        async def caught_up() -> None:
            while runner.level < head or runner.state != "in_sync":
                await asyncio.sleep(0.05)

        await asyncio.wait_for(caught_up(), 120)
        assert sum(held.sizes) == head
        with sqlite3.connect(tmp_path / "target.db") as tgt:
            got = tgt.execute("SELECT count(*), min(id), max(id) FROM notes").fetchone()
        assert got == (600, 0, 599)
        if plan_ahead:
            assert sum(held.ahead) >= len(held.ahead) // 2, held.ahead
        else:
            assert not any(held.ahead), held.ahead
    finally:
        runner.stop()
        await asyncio.wait_for(task, 60)


DELAY_MS = 5000


@pytest.mark.spark
async def test_in_sync_each_entry_is_applied_as_it_comes_and_timed_stage_by_stage(
    pub: Pub, spark: Any, tmp_path: Path
) -> None:
    """In sync, entries committed one by one, 0.5 s apart, get an apply each, at once, and
    every leg of their path shows in the stage latency histograms (issue 23).

    ``max_delay_ms`` is set to 5 s: before natural batching the first apply waited that
    long for more, so the five shared one or two applies.
    """
    from subscriber.config import BatchConfig
    from tests.support.scrape import scrape

    runner, counted, task = bulk_runner(pub, spark, tmp_path, BatchConfig(max_delay_ms=DELAY_MS))
    try:

        async def reached(seq: int) -> None:
            while runner.level < seq or runner.state != "in_sync":
                await asyncio.sleep(0.02)

        await asyncio.wait_for(reached(pub.head("bulk")), 120)
        start = len(counted.sizes)
        before = dict(runner.stages.counts)
        head = 0
        for i in range(5):
            head = await asyncio.to_thread(pub.publish, "bulk", 1, 10, 1 + i)
            await asyncio.sleep(0.5)
        await asyncio.wait_for(reached(head), 60)
        after = counted.sizes[start:]
        assert sum(after) == 5, after
        # One apply per entry; a loaded machine may let two meet in one apply.
        assert len(after) >= 4, f"{len(after)} applies for 5 entries: {after}"
        name = runner.name
        for stage in ("receive", "queue", "apply", "commit", "total"):
            got = runner.stages.count(name, stage) - before.get((name, stage), 0)
            assert got >= len(after), (stage, got, after)
        samples = scrape(pub.daemon.metrics_address)
        for stage, least in (("durable", head), ("send", 5)):  # send: one per message
            key = (
                "txrepl_publication_stage_seconds_count",
                frozenset({("publication", "bulk"), ("stage", stage)}),
            )
            assert samples.get(key, 0) >= least, (stage, samples.get(key))
    finally:
        runner.stop()
        await asyncio.wait_for(task, 60)
