"""One subscription's connection loop: states, reconnects, back-pressure, apply, ack.

States and transitions (each logged and kept, timestamped, in the timeline)::

    disconnected ──▶ connecting ──Welcome──▶ syncing ──InSync──▶ in_sync
         ▲               │                      │                   │
         └──backoff──────┴──── stream ends / cut / transient error ─┘
    paused   : by the control service; no connection until resumed
    scheduled: a scheduled subscription between runs; it connects at the next
               scheduled time, syncs until in sync, then disconnects
    error    : a permanent failure (gap, changed incarnation, publisher behind our
               level, apply failure); waits for an operator's reconnect
    invalid  : the publisher refused us as invalid; waits for re-initialisation,
               mark-valid, then a reconnect

Back-pressure: received batches wait in a bounded queue (``queue_batches``);
the receive loop blocks on a full queue and stops reading the stream, so a slow
apply shows at the publisher as a slow feed, never as memory growth here.
Coalescing: a batch that arrives while the previous one has not been taken by
the apply yet (waiting for room in the queue, or queued) joins it (consecutive
seqs), up to 1/``queue_batches`` of the batch limits (``max_entries``,
``max_bytes``); only a full queue blocks the reading.  In sync the publisher
sends entries one by one as they commit, so without this an apply would get at
most ``queue_batches`` entries and fall behind a busy source however large
``max_entries`` is.  Memory stays bounded by the same limits: the queue holds at
most ``queue_batches`` items of that size, plus the one waiting for room.

Exactly once: the level lives in the target, written in the same transaction as
the rows (subscriber/apply).  After any disconnect, batches received but not yet
applied are dropped and the next Hello carries the applied level, so the
publisher resends from level + 1.  A gap (first seq != expected) is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog

from common.errors import describe_rpc_error
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from subscriber.apply import AnyEntry, Applier, ApplyError, Planned, RawEntry
from subscriber.config import BackoffConfig, BatchConfig, SubscriptionConfig
from subscriber.reinit import SnapshotRefused
from subscriber.schedule import Clock, SystemClock

__all__ = ["STATES", "SubscriptionRunner"]

log = structlog.get_logger(__name__)

STATES = (
    "disconnected",
    "connecting",
    "syncing",
    "in_sync",
    "paused",
    "error",
    "invalid",
    "scheduled",
)


def _entries(payloads: list[bytes]) -> list[AnyEntry]:
    # Parsed lazily: the apply walks the bytes (subscriber.apply.entry).
    return [RawEntry(p) for p in payloads]


class PermanentFeedError(Exception):
    """The conversation cannot go on without an operator."""


class InvalidSubscriber(Exception):
    """The publisher marked us invalid."""


class SnapshotRequired(Exception):
    """The publisher no longer has seq 1 for this new subscriber."""


class Interrupted(Exception):
    """An operator paused, asked to reconnect, or the daemon is stopping."""


@dataclass
class Received:
    first_seq: int
    entries: list[bytes]
    head: int
    received_at: float = field(default_factory=time.monotonic)
    size: int = 0  # bytes of the entries
    taken: bool = False  # by the apply loop: nothing may join it any more


class SubscriptionRunner:
    def __init__(
        self,
        config: SubscriptionConfig,
        subscriber_name: str,
        applier: Applier,
        *,
        batch: BatchConfig,
        backoff: BackoffConfig,
        channel_factory: Callable[[str], grpc.aio.Channel] | None = None,
        clock: Clock | None = None,
        snapshot: Callable[[], tuple[str, int]] | None = None,
    ) -> None:
        self.config = config
        self.name = config.id
        self.subscriber_name = subscriber_name
        self.applier = applier
        self.batch = batch
        self.backoff = backoff
        self.channel_factory = channel_factory or (
            lambda addr: grpc.aio.insecure_channel(
                addr,
                options=[
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    ("grpc.keepalive_time_ms", 20_000),
                ],
            )
        )
        st = applier.load_state()
        self.level = st.level
        self.incarnation = st.incarnation
        self.head = st.level
        self.state = "disconnected"
        self.timeline: list[tuple[float, str, str]] = [(time.time(), "disconnected", "started")]
        self.last_error = ""
        self.applied_entries = 0
        self.applied_rows = 0
        self.sessions = 0  # streams that got as far as a Welcome
        self._paused = False
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._call: grpc.aio.StreamStreamCall[pb.SubscriberMessage, pb.PublisherMessage] | None
        self._call = None
        self._interrupted = asyncio.Event()
        self._in_sync_head: int | None = None
        self.clock: Clock = clock or SystemClock()
        self.snapshot = snapshot  # loads a snapshot into the target: (incarnation, seq)
        self.schedule = config.schedule
        self.last_run_start: float | None = None
        self.next_run: float | None = None
        self.runs = 0
        self._run_done = False
        self._ending = False  # the session is ending: the apply loop stops between batches

    # -- control --------------------------------------------------------------------

    def _set(self, state: str, reason: str = "") -> None:
        if state == self.state and not reason:
            return
        prev, self.state = self.state, state
        self.timeline.append((time.time(), state, reason))
        del self.timeline[:-100]
        log.info(
            "subscription state",
            subscription=self.name,
            state=state,
            previous=prev,
            reason=reason,
            sync_level=self.level,
        )

    def pause(self) -> None:
        self._paused = True
        self._interrupt()
        self._set("paused", "paused by operator")

    def resume(self) -> None:
        self._paused = False
        if self.state == "paused":
            self._set("disconnected", "resumed by operator")
        self._wake.set()

    def reconnect(self) -> None:
        """Drop the current connection (if any) and connect again now."""
        self._paused = False
        self._interrupt()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._interrupt()
        self._wake.set()

    def _interrupt(self) -> None:
        # Not call.cancel(): that raises CancelledError in the awaiting task, which
        # must stay reserved for the task's own cancellation.
        self._interrupted.set()

    async def _read(
        self,
        call: grpc.aio.StreamStreamCall[pb.SubscriberMessage, pb.PublisherMessage],
        applier: asyncio.Task[None] | None = None,
    ) -> pb.PublisherMessage | None:
        """The next message; None at EOF or when the applier task ended first."""
        read = asyncio.ensure_future(call.read())
        intr = asyncio.ensure_future(self._interrupted.wait())
        waits: set[asyncio.Future[Any]] = {read, intr}
        if applier is not None:
            waits.add(applier)
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            intr.cancel()
        if read in done:
            try:
                msg = read.result()
            except grpc.aio.AioRpcError as e:
                self._classify(e.code(), e.details() or "")
                raise
            if msg is grpc.aio.EOF:
                return None
            assert isinstance(msg, pb.PublisherMessage)
            return msg
        read.cancel()
        if intr in done and self._interrupted.is_set():
            raise Interrupted()
        return None

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short by reconnect/resume/stop."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _wait_for_schedule(self) -> None:
        """Between runs of a scheduled subscription: sleep until the next time."""
        now = self.clock.now()
        self.next_run = self.schedule.next_run(now, self.last_run_start)
        if self.next_run > now:
            at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.next_run))
            self._set("scheduled", f"next run at {at}")
            self._wake.clear()
            await self.clock.sleep(self.next_run - now, self._wake)
        self.last_run_start = self.clock.now()

    # -- main loop ------------------------------------------------------------------------

    async def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            if self._paused:
                await self._sleep(3600)
                continue
            if self.schedule.enabled and failures == 0:
                await self._wait_for_schedule()
                if self._stop.is_set() or self._paused:
                    continue
            self._run_done = False
            self._interrupted.clear()
            self._set("connecting", f"to {self.config.publisher} at {self.config.address}")
            progressed = False
            try:
                progressed = await self._session()
                if self._run_done:
                    # A scheduled run reached the head: disconnect until the next time.
                    self.runs += 1
                    failures = 0
                    continue
                if not self._stop.is_set() and not self._paused:
                    self._set("disconnected", "stream ended")
            except SnapshotRequired as e:
                if self.snapshot is None or self.config.initial == "log":
                    self.last_error = f"{e}; this target cannot load snapshots"
                    self._set("error", self.last_error)
                    await self._sleep(3600)
                    continue
                try:
                    await self._load_snapshot(str(e))
                except SnapshotRefused as err:
                    # The configuration, not the moment: waits for an operator.
                    self.last_error = str(err)
                    self._set("error", self.last_error)
                    await self._sleep(3600)
                    continue
                except Exception as err:
                    self.last_error = f"snapshot failed: {err}"
                    self._set("disconnected", self.last_error)
                    failures += 1
                    await self._sleep(self.backoff.delay(failures, random.random()))
                continue
            except Interrupted:
                if not self._paused and not self._stop.is_set():
                    self._set("disconnected", "reconnect requested")
                failures = 0
                continue
            except InvalidSubscriber as e:
                self.last_error = str(e)
                self._set("invalid", str(e))
                log.error(
                    "subscriber is invalid: re-initialise the target, have the publisher's "
                    "operator run 'txrepl admin mark-valid', then 'txrepl subscriber reconnect'",
                    subscription=self.name,
                    reason=str(e),
                )
                await self._sleep(3600)
                continue
            except PermanentFeedError as e:
                self.last_error = str(e)
                self._set("error", str(e))
                await self._sleep(3600)
                continue
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED and (self._paused or self._stop.is_set()):
                    continue
                self.last_error = describe_rpc_error(e)
                self._set("disconnected", self.last_error)
            except ConnectionError as e:  # refused for now (cut, unknown publication, ...)
                self.last_error = str(e)
                log.warning("sync ended", subscription=self.name, reason=str(e))
                self._set("disconnected", self.last_error)
            except ApplyError as e:
                self.last_error = f"apply failed: {e}"
                self._set("error", self.last_error)
                await self._sleep(3600)
                continue
            except Exception as e:  # a bug or an unexpected failure: keep trying, loudly
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("subscription failed", subscription=self.name)
                self._set("disconnected", self.last_error)
            if self._stop.is_set():
                break
            failures = 1 if progressed else failures + 1
            delay = self.backoff.delay(failures, random.random())
            log.info("reconnecting", subscription=self.name, in_s=round(delay, 2), attempt=failures)
            await self._sleep(delay)
        self._set("disconnected", "stopped")

    async def _load_snapshot(self, reason: str) -> None:
        assert self.snapshot is not None
        self._set("syncing", f"loading a snapshot ({reason})")
        incarnation, seq = await asyncio.to_thread(self.snapshot)
        self.applier.load_state()
        self.level, self.incarnation = seq, incarnation
        log.info("snapshot loaded", subscription=self.name, sync_level=seq)

    async def _session(self) -> bool:
        """One connection; returns True if anything was applied."""
        progressed = False
        # The target is the truth: an operator's reinit may have moved the level.
        st = await asyncio.to_thread(self.applier.load_state)
        self.level, self.incarnation = st.level, st.incarnation
        if self.level == 0 and not self.incarnation and self.config.initial == "snapshot":
            raise SnapshotRequired('initial = "snapshot"')
        async with self.channel_factory(self.config.address) as channel:
            stub = rpc.ReplicationStub(channel)
            metadata = (("x-txrepl-token", self.config.token),) if self.config.token else None
            call = stub.Sync(metadata=metadata)
            self._call = call
            try:
                hello = pb.SubscriberMessage()
                hello.hello.subscriber = self.subscriber_name
                hello.hello.publisher = self.config.publisher
                hello.hello.publication = self.config.publication
                hello.hello.incarnation = self.incarnation
                hello.hello.level = self.level
                await call.write(hello)
                first = await self._read(call)
                if first is None:
                    await self._raise_status(call)
                    raise PermanentFeedError("publisher closed the stream without a Welcome")
                if not first.HasField("welcome"):
                    raise PermanentFeedError(f"expected Welcome, got {first.WhichOneof('kind')}")
                self._check_welcome(first.welcome)
                self._in_sync_head = None
                self.sessions += 1
                self._set("syncing", f"level {self.level}, head {first.welcome.head}")
                queue: asyncio.Queue[Received | None] = asyncio.Queue(self.batch.queue_batches)
                self._ending = False
                applier = asyncio.create_task(self._apply_loop(queue, call))
                try:
                    await self._receive_loop(call, queue, applier)
                finally:
                    if not applier.done():
                        # Let the batch in flight finish (a thread cannot be cancelled),
                        # drop the rest: the next Hello resumes from the applied level.
                        self._ending = True  # a batch planned ahead is not applied
                        while not queue.empty():
                            queue.get_nowait()
                        queue.put_nowait(None)
                        with contextlib.suppress(Exception):
                            await applier
                    progressed = self.applied_entries > 0
                    if applier.done() and not applier.cancelled():
                        exc = applier.exception()
                        if exc is not None:
                            raise exc
            finally:
                self._call = None
                call.cancel()
        return progressed

    def _check_welcome(self, w: pb.Welcome) -> None:
        if self.incarnation and w.incarnation != self.incarnation:
            raise PermanentFeedError(
                f"publication {w.publication!r} changed incarnation from {self.incarnation} to "
                f"{w.incarnation}: it was re-created; re-initialise this subscription"
            )
        if w.head < self.level:
            raise PermanentFeedError(
                f"publisher head {w.head} is below our level {self.level}: the publisher lost "
                "entries; refusing to continue"
            )
        if not self.incarnation:
            self.incarnation = w.incarnation
        self.head = w.head

    async def _raise_status(
        self, call: grpc.aio.StreamStreamCall[pb.SubscriberMessage, pb.PublisherMessage]
    ) -> None:
        self._classify(await call.code(), await call.details() or "")

    @staticmethod
    def _classify(code: grpc.StatusCode, details: str) -> None:
        """Raise what a stream ended with ``code`` means for this subscription."""
        if code == grpc.StatusCode.OK:
            return
        if code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(
            "subscriber is invalid"
        ):
            raise InvalidSubscriber(details)
        if code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith("snapshot required"):
            raise SnapshotRequired(details)
        if code in (
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.OUT_OF_RANGE,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED,
        ):
            raise PermanentFeedError(f"{code.name}: {details}")
        # NOT_FOUND (publication not yet configured), ABORTED (cut), UNAVAILABLE...:
        # worth retrying with backoff.
        raise ConnectionError(f"{code.name}: {details}")

    async def _receive_loop(
        self,
        call: grpc.aio.StreamStreamCall[pb.SubscriberMessage, pb.PublisherMessage],
        queue: asyncio.Queue[Received | None],
        applier: asyncio.Task[None],
    ) -> None:
        expected = self.level + 1
        room_entries = max(1, self.batch.max_entries // self.batch.queue_batches)
        room_bytes = max(1, self.batch.max_bytes // self.batch.queue_batches)
        last: Received | None = None  # the newest item, queued or waiting for room
        put: asyncio.Future[None] | None = None
        try:
            while True:
                msg = await self._read(call, applier)
                if msg is None:
                    if not applier.done():
                        await self._raise_status(call)
                    return
                kind = msg.WhichOneof("kind")
                if kind == "batch":
                    b = msg.batch
                    if b.first_seq != expected:
                        raise PermanentFeedError(
                            f"gap in the feed: got seq {b.first_seq}, expected {expected}"
                        )
                    expected += len(b.entries)
                    self.head = max(self.head, b.head, expected - 1)
                    # A batch larger than an item (the publisher's batch_entries above
                    # max_entries / queue_batches) is queued in pieces, so an apply
                    # never takes more than max_entries.
                    payloads = list(b.entries)
                    for i in range(0, len(payloads), room_entries):
                        chunk = payloads[i : i + room_entries]
                        size = sum(map(len, chunk))
                        if (
                            last is not None
                            and not last.taken
                            and len(last.entries) + len(chunk) <= room_entries
                            and last.size + size <= room_bytes
                        ):
                            # Not taken by the apply yet: ride along (single threaded, so
                            # the apply cannot take it meanwhile).
                            last.entries.extend(chunk)
                            last.head = b.head
                            last.size += size
                            continue
                        if put is not None and not await self._put_done(put, applier):
                            return
                        last = Received(b.first_seq + i, chunk, b.head, size=size)
                        put = asyncio.ensure_future(queue.put(last))
                    continue
                elif kind == "in_sync":
                    self.head = max(self.head, msg.in_sync.head)
                    self._in_sync_head = msg.in_sync.head
                    if self.level >= msg.in_sync.head:
                        self._reached_in_sync(queue)
                elif kind == "heartbeat":
                    self.head = max(self.head, msg.heartbeat.head)
                else:
                    raise PermanentFeedError(f"unexpected message {kind!r} from the publisher")
        finally:
            if put is not None and not put.done():
                put.cancel()  # the session is ending: what was not queued is resent

    async def _put_done(self, put: asyncio.Future[None], applier: asyncio.Task[None]) -> bool:
        """Wait until ``put`` has queued its item; False if the apply ended first.

        Blocks while the queue is full: back-pressure onto the stream.
        """
        if put.done():
            return True
        intr = asyncio.ensure_future(self._interrupted.wait())
        waits: set[asyncio.Future[Any]] = {put, applier, intr}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            intr.cancel()
        if put in done:
            return True
        put.cancel()
        if self._interrupted.is_set():
            raise Interrupted()
        return False

    async def _gather(
        self, queue: asyncio.Queue[Received | None], *, linger: bool
    ) -> tuple[int, list[bytes], int] | None:
        """The next batch to apply, or None once the session ends.

        Natural batching: everything that arrived while the last apply ran goes into
        this one, up to the limits; with ``linger`` (in sync), waiting up to
        ``max_delay_ms`` for more.
        """
        item = await queue.get()
        if item is None:
            return None
        item.taken = True
        first_seq = item.first_seq
        payloads = list(item.entries)
        size = item.size
        deadline = time.monotonic() + self.batch.max_delay_ms / 1000
        lingering = linger and self.batch.max_delay_ms > 0 and self.state == "in_sync"
        while len(payloads) < self.batch.max_entries and size < self.batch.max_bytes:
            if queue.empty():
                left = deadline - time.monotonic()
                if not lingering or left <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
            else:
                nxt = queue.get_nowait()
            if nxt is None:
                queue.put_nowait(None)
                break
            nxt.taken = True
            payloads.extend(nxt.entries)
            size += nxt.size
        return first_seq, payloads, size

    async def _apply_loop(
        self,
        queue: asyncio.Queue[Received | None],
        call: grpc.aio.StreamStreamCall[pb.SubscriberMessage, pb.PublisherMessage],
    ) -> None:
        """Apply batches in order; ack each one once committed.

        Plan ahead (``plan_ahead``, while syncing): while batch *n* is written to the
        target, batch *n+1*, if it is already waiting in the queue, is taken and planned in
        another thread against *n*'s schemas (:meth:`Applier.plan`).  Nothing of
        *n+1* reaches the target before *n* commits: its write starts after, and
        re-checks the level in its own transaction.  If *n* fails, *n+1*'s plan is
        dropped with the session (the next Hello resumes from the applied level).
        """
        ahead: tuple[int, int, asyncio.Future[tuple[list[AnyEntry], Planned]]] | None = None
        try:
            while True:
                planned: Planned | None = None
                if ahead is not None:
                    if self._ending:
                        return  # dropped with the queue: resent after the next Hello
                    first_seq, size, planning = ahead
                    ahead = None
                    started = time.monotonic()
                    entries, planned = await planning
                else:
                    got = await self._gather(queue, linger=True)
                    if got is None:
                        return
                    first_seq, payloads, size = got
                    started = time.monotonic()
                    if (
                        self.batch.plan_ahead
                        and self.state == "syncing"
                        and self.head >= first_seq + len(payloads)
                    ):
                        # More is coming: plan this one first, so the next can plan
                        # while this one writes.
                        entries, planned = await asyncio.to_thread(
                            self._parse_and_plan, first_seq, payloads, None
                        )
                    else:
                        entries = _entries(payloads)
                writing = asyncio.ensure_future(
                    asyncio.to_thread(
                        self.applier.apply,
                        first_seq,
                        entries,
                        incarnation=self.incarnation,
                        planned=planned,
                    )
                )
                if planned is not None and planned.error is None and queue.empty():
                    await asyncio.sleep(0)  # let the receive loop queue what it holds
                if planned is not None and planned.error is None and not queue.empty():
                    got = await self._gather(queue, linger=False)
                    if got is None:
                        queue.put_nowait(None)  # seen again once this batch is acked
                    else:
                        nxt_first, nxt_payloads, nxt_size = got
                        ahead = (
                            nxt_first,
                            nxt_size,
                            asyncio.ensure_future(
                                asyncio.to_thread(
                                    self._parse_and_plan, nxt_first, nxt_payloads, planned
                                )
                            ),
                        )
                result = await writing
                now = time.time()
                self.level = result.level
                self.applied_entries += len(entries)
                self.applied_rows += result.rows
                log.info(
                    "batch applied",
                    subscription=self.name,
                    first_seq=first_seq,
                    sync_level=self.level,
                    entries=len(entries),
                    rows=result.rows,
                    bytes=size,
                    seconds=round(time.monotonic() - started, 4),
                    plan_seconds=round(result.plan_seconds, 4),
                    # the apply call itself: the write, and the plan unless made ahead
                    apply_seconds=round(result.seconds, 4),
                    planned_ahead=result.planned_ahead,
                    head=self.head,
                    # source commit -> applied here, of the batch's newest and oldest entry
                    lag_ms=round((now - entries[-1].commit_time_us / 1e6) * 1000, 1),
                    oldest_ms=round((now - entries[0].commit_time_us / 1e6) * 1000, 1),
                )
                ack = pb.SubscriberMessage()
                ack.ack.level = self.level
                with contextlib.suppress(Exception):
                    await call.write(ack)
                if self._in_sync_head is not None and self.level >= self._in_sync_head:
                    self._reached_in_sync(queue)
                    if self._run_done:
                        return
        finally:
            if ahead is not None:
                # A plan thread cannot be cancelled: let it end before the session does.
                with contextlib.suppress(BaseException):
                    await ahead[2]

    def _parse_and_plan(
        self, first_seq: int, payloads: list[bytes], after: Planned | None
    ) -> tuple[list[AnyEntry], Planned]:
        entries = _entries(payloads)
        return entries, self.applier.plan(first_seq, entries, after=after)

    def _reached_in_sync(self, queue: asyncio.Queue[Received | None]) -> None:
        # A transition, not every batch applied at the head: the timeline keeps the
        # last 100 changes, and a busy in-sync feed would flush everything else out.
        if self.state != "in_sync":
            self._set("in_sync", f"head {self._in_sync_head}")
        if self.schedule.enabled and not self._run_done:
            self._run_done = True
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)  # the applier returns; the session ends

    def status(self) -> pb.SubscriptionStatus:
        st = pb.SubscriptionStatus(
            name=self.name,
            publisher=self.config.publisher,
            publication=self.config.publication,
            state=self.state,
            level=self.level,
            head=max(self.head, self.level),
            last_error=self.last_error,
            applied_entries=self.applied_entries,
            applied_rows=self.applied_rows,
            sessions=self.sessions,
        )
        for at, state, reason in self.timeline[-20:]:
            st.timeline.add(state=state, at_us=int(at * 1e6), reason=reason)
        return st
