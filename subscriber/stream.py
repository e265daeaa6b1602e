"""The subscriber's end of one Sync stream: Hello/Welcome, the receive loop, refusals.

Conversation (proto/txrepl/v1, ``Replication.Sync``)::

    → Hello(subscriber, publisher, publication, incarnation, level)
    ← Welcome(incarnation, head)           checked: same incarnation, head >= level
    ← Batch(first_seq, entries, head) ...  checked: first_seq == level + 1, no gap
    ← InSync(head)                         in sync once our level reaches head
    ← Heartbeat(head)                      when idle
    → Ack(level)                           after each applied batch (the pipeline)
    ← status                               a refusal or a cut ends the stream

Received batches go to the :class:`~subscriber.batcher.Batcher`; blocking there
stops the reading (back-pressure).  Reading is cut short by an operator's
pause/reconnect (:class:`Interrupted`) and by the apply ending.

Reading without a task per message (issue 23): :meth:`FeedStream.receive` awaits
``call.read()`` itself, in the session's task.  The two things that end it early
(the apply's task done, the interruption event set) each get one done-callback for
the whole session, which cancels that task once; the ``CancelledError`` is ours
only if the callback fired and ``Task.uncancel()`` leaves no other cancellation
(a daemon's shutdown still goes up).  A callback that comes after ``receive``
returned does nothing (``_Stopper.armed``), so the cancellation can only land on
an await inside ``receive``.  Reading stays strictly sequential in one coroutine:
a full batcher still stops it.

Acks, coalesced (issue 23): :meth:`FeedStream.offer_ack` (from the session's
apply thread, subscriber/pipeline.py) and :meth:`FeedStream.ack` (on the loop) only
record the level and, unless it runs, start the session's one ack writer (a task):
it writes at once when no ack went out in the last ``ack_interval`` seconds,
otherwise when the interval ends, and sends the *latest* level each time, again if
more came while it waited or wrote.  So at most one ack message per interval, none
lost: levels only grow, and a later ack covers every earlier one (the publisher
needs only the last: retention, status, the queue threshold).  The apply thread
wakes the loop only to start a writer: the level, and whether a writer runs, are
read and written under one lock, and the writer ends only when, under that lock,
no newer level came since it wrote; so a level offered while it ends starts a new
one, and a level offered while it runs is sent by it.  The caller never waits for
a gRPC write (its completion comes back through gRPC's poller).  Never two writes
at once on the call (gRPC allows one): the writer task is the only writer while it
exists, and a lock covers any other (a test's).
:meth:`FeedStream.flush_acks` sends a pending level at once (the session's end).
A lost ack loses nothing: the next Hello carries the level.

How a stream ended decides what the subscription does next (:func:`classify`):
the publisher's RefusalKind, sent in the trailing metadata (common.feedstatus),
names the refusal; without one (a refusal from outside the feed, a lost
connection) the status code decides.  Never the text of the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from common import trace as _trace
from common.feedstatus import RefusalKind, refusal_kind
from common.latency import StageLatency
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from subscriber.batcher import Batcher
from subscriber.config import SubscriptionConfig
from subscriber.errors import (
    FeedEnded,
    Interrupted,
    InvalidSubscriber,
    PermanentFeedError,
    SnapshotRequired,
)
from subscriber.state import SubscriptionState

__all__ = ["ACK_INTERVAL_S", "REFUSALS", "FeedStream", "classify"]

# At most one ack message per this many seconds while batches keep coming.  At
# 1,000 txn/s in sync an apply commits every 1-3 ms; the publisher writes the
# acked level to its registry at most every 0.1 s (publisher/acks.py) and its
# queue threshold counts thousands of entries, so a few ms of delay costs nothing
# there, and each ack saved is a gRPC write here and a read there.
ACK_INTERVAL_S = 0.005

# What each refusal means here.  Retried: the publication may be configured later,
# a Hello may be late.  Everything else needs an operator (or a snapshot).
REFUSALS: dict[RefusalKind, type[Exception]] = {
    pb.REFUSAL_KIND_MALFORMED: PermanentFeedError,
    pb.REFUSAL_KIND_HELLO_TIMEOUT: FeedEnded,
    pb.REFUSAL_KIND_WRONG_PUBLISHER: PermanentFeedError,
    pb.REFUSAL_KIND_UNKNOWN_PUBLICATION: FeedEnded,
    pb.REFUSAL_KIND_UNAUTHENTICATED: PermanentFeedError,
    pb.REFUSAL_KIND_PERMISSION_DENIED: PermanentFeedError,
    pb.REFUSAL_KIND_INCARNATION_CHANGED: PermanentFeedError,
    pb.REFUSAL_KIND_AHEAD_OF_HEAD: PermanentFeedError,
    pb.REFUSAL_KIND_SNAPSHOT_REQUIRED: SnapshotRequired,
    pb.REFUSAL_KIND_INVALID: InvalidSubscriber,
}

# Without a kind: codes that retrying will not change.  NOT_FOUND (publication not
# yet configured), ABORTED (cut), UNAVAILABLE...: worth retrying with backoff.
_PERMANENT_CODES = frozenset(
    {
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


def classify(
    code: grpc.StatusCode, details: str, trailing: Iterable[tuple[str, str | bytes]] | None
) -> None:
    """Raise what a stream that ended with ``code`` means for this subscription."""
    if code == grpc.StatusCode.OK:
        return
    kind = refusal_kind(trailing)
    if kind != pb.REFUSAL_KIND_UNSPECIFIED:
        error = REFUSALS[kind]
    else:
        error = PermanentFeedError if code in _PERMANENT_CODES else FeedEnded
    if error in (InvalidSubscriber, SnapshotRequired):
        raise error(details)  # the publisher's message says what to do
    raise error(f"{code.name}: {details}")


def accept_welcome(state: SubscriptionState, w: pb.Welcome) -> None:
    """Refuse a Welcome we cannot continue from; else take its incarnation and head."""
    if state.incarnation and w.incarnation != state.incarnation:
        raise PermanentFeedError(
            f"publication {w.publication!r} changed incarnation from {state.incarnation} to "
            f"{w.incarnation}: it was re-created; re-initialise this subscription"
        )
    if w.head < state.level:
        raise PermanentFeedError(
            f"publisher head {w.head} is below our level {state.level}: the publisher lost "
            "entries; refusing to continue"
        )
    if not state.incarnation:
        state.incarnation = w.incarnation
    state.head = w.head


Call = grpc.aio.StreamStreamCall[pb.SubscriberMessage, pb.PublisherMessage]


class FeedStream:
    """One Sync call to the publisher, for one session."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        config: SubscriptionConfig,
        interrupted: asyncio.Event,
        *,
        ack_interval: float = ACK_INTERVAL_S,
    ) -> None:
        self.config = config
        self.ack_interval = ack_interval
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._ack_mutex = threading.Lock()  # the two fields below (the module docstring)
        self._ack_level = 0  # the newest level offered
        self._ack_active = False  # a writer runs, or its start is on its way to the loop
        self._ack_sent_at = -math.inf  # time.monotonic() of the last ack write's start
        self._ack_later: asyncio.Task[None] | None = None  # the writer
        self._ack_due: asyncio.Future[None] | None = None  # its wait (flush_acks ends it)
        self._ack_now = False  # flush_acks: no more waiting
        self._ack_lock = asyncio.Lock()
        #: ack messages written (tests and benchmarks read it).
        self.acks_sent = 0
        # The token rides on the channel (common.security.aio_channel_factory).
        self.call: Call = rpc.ReplicationStub(channel).Sync()
        self._interrupted = interrupted
        # One wait for an operator's interruption, shared by every read of the session
        # (a task per read cost more than the read itself); ended by cancel().
        self._intr: asyncio.Future[Any] | None = None

    async def hello(self, subscriber: str, state: SubscriptionState) -> pb.Welcome:
        """Send Hello from ``state``'s level; the publisher's Welcome, checked."""
        hello = pb.SubscriberMessage()
        hello.hello.subscriber = subscriber
        hello.hello.publisher = self.config.publisher
        hello.hello.publication = self.config.publication
        hello.hello.incarnation = state.incarnation
        hello.hello.level = state.level
        try:
            await self.call.write(hello)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            # A publisher that refuses the call itself (a missing or wrong token) may
            # end it before the Hello goes out: the write then fails here ("RPC already
            # finished", or INTERNAL in the race), and the call's status says why.  A
            # failed connection (UNAVAILABLE) goes up as before: the runner names a TLS
            # mismatch from it.
            if await self.call.code() != grpc.StatusCode.UNAVAILABLE:
                await self.raise_status()
            raise
        first = await self.read()
        if first is None:
            await self.raise_status()
            raise PermanentFeedError("publisher closed the stream without a Welcome")
        if not first.HasField("welcome"):
            raise PermanentFeedError(f"expected Welcome, got {first.WhichOneof('kind')}")
        accept_welcome(state, first.welcome)
        return first.welcome

    async def read(self) -> pb.PublisherMessage | None:
        """The next message (the Welcome), interruptible; None at EOF."""
        read = asyncio.ensure_future(self.call.read())
        intr = self._interruption()
        done, _ = await asyncio.wait({read, intr}, return_when=asyncio.FIRST_COMPLETED)
        if read in done:
            return _message(read.result)
        read.cancel()
        raise Interrupted()

    def _interruption(self) -> asyncio.Future[Any]:
        intr = self._intr
        if intr is None or intr.done():
            intr = self._intr = asyncio.ensure_future(self._interrupted.wait())
        return intr

    async def raise_status(self) -> None:
        """Raise what the ended stream's status means (nothing if OK)."""
        call = self.call
        classify(await call.code(), await call.details() or "", await call.trailing_metadata())

    async def ack(self, level: int) -> None:
        """Tell the publisher ``level`` is applied (best effort: a lost ack is resent).

        Coalesced: at most one write per ``ack_interval`` (the module docstring).
        """
        self.offer_ack(level)

    def offer_ack(self, level: int) -> None:
        """:meth:`ack` from any thread, without waiting."""
        with self._ack_mutex:
            self._ack_level = max(self._ack_level, level)
            if self._ack_active:
                return  # the writer sends the latest level
            self._ack_active = True
        if threading.get_ident() == self._loop_thread:
            self._start_acks()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the session is over
                self._loop.call_soon_threadsafe(self._start_acks)

    def _start_acks(self) -> None:
        wait = self._ack_sent_at + self.ack_interval - time.monotonic()
        self._ack_later = asyncio.ensure_future(self._ack_after(wait))

    async def flush_acks(self) -> None:
        """Send a level that waits for its interval (or is being written) now: the
        session is ending."""
        later = self._ack_later
        if later is None:
            return
        self._ack_now = True
        if self._ack_due is not None and not self._ack_due.done():
            self._ack_due.set_result(None)
        # asyncio.wait: our cancellation does not cancel the write (gRPC would cancel the
        # call), and the write's cancellation (cancel()) is not raised here.  The
        # write's own failures are dropped by _write_ack.
        await asyncio.wait({later})

    async def _ack_after(self, wait: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if wait > 0 and not self._ack_now:
                    due = self._ack_due = loop.create_future()
                    timer = loop.call_later(wait, _resolve, due)
                    try:
                        await due
                    finally:
                        timer.cancel()
                with self._ack_mutex:
                    level = self._ack_level
                await self._write_ack(level)
                with self._ack_mutex:
                    if self._ack_level == level:
                        self._ack_active = False
                        return
                wait = self.ack_interval  # more came during the wait: one more round
        except BaseException:
            with self._ack_mutex:
                self._ack_active = False  # cancelled with the session (cancel())
            raise
        finally:
            self._ack_later = self._ack_due = None
            self._ack_now = False

    async def _write_ack(self, level: int) -> None:
        self._ack_sent_at = time.monotonic()
        ack = pb.SubscriberMessage()
        ack.ack.level = level
        # One write at a time (gRPC refuses a second): an inline write that outlasts
        # the interval is still in flight when the deferred one's time comes.
        async with self._ack_lock:
            with contextlib.suppress(Exception):
                await self.call.write(ack)
                self.acks_sent += 1

    async def receive(
        self,
        state: SubscriptionState,
        batcher: Batcher,
        consumer: asyncio.Task[None],
        on_in_sync: Callable[[], Any],
        stages: StageLatency | None = None,
    ) -> None:
        """Read the stream into ``batcher`` until it ends or ``consumer`` does.

        ``stages``: observes each batch message's ``receive`` stage (common/latency.py).
        """
        expected = state.level + 1
        task = asyncio.current_task()
        assert task is not None
        stopper = _Stopper(task)
        intr = self._interruption()
        consumer.add_done_callback(stopper)
        intr.add_done_callback(stopper)
        read = self.call.read
        try:
            while True:
                try:
                    msg = await read()
                except grpc.aio.AioRpcError as e:
                    classify(e.code(), e.details() or "", e.trailing_metadata())
                    raise
                if msg is grpc.aio.EOF:
                    if not consumer.done():
                        await self.raise_status()
                    return
                assert isinstance(msg, pb.PublisherMessage)
                kind = msg.WhichOneof("kind")
                if kind == "batch":
                    b = msg.batch
                    if stages is not None and b.sent_us:
                        stages.observe(state.name, "receive", time.time() - b.sent_us / 1e6)
                    if _trace.TRACE is not None:  # common/trace.py, a diagnostic
                        _trace.TRACE.span(
                            b.first_seq, len(b.entries), "received", int(time.time() * 1e6)
                        )
                    if b.first_seq != expected:
                        raise PermanentFeedError(
                            f"gap in the feed: got seq {b.first_seq}, expected {expected}"
                        )
                    expected += len(b.entries)
                    state.head = max(state.head, b.head, expected - 1)
                    if not await batcher.put(b.first_seq, b.entries, b.head, consumer):
                        return
                elif kind == "in_sync":
                    state.head = max(state.head, msg.in_sync.head)
                    state.in_sync_head = msg.in_sync.head
                    if state.at_head():
                        on_in_sync()
                elif kind == "heartbeat":
                    state.head = max(state.head, msg.heartbeat.head)
                else:
                    raise PermanentFeedError(f"unexpected message {kind!r} from the publisher")
        except asyncio.CancelledError:
            if not stopper.fired or task.uncancel() > 0:
                raise  # not ours (or not only ours): the daemon is stopping
            if self._interrupted.is_set():
                raise Interrupted() from None
            return  # the apply ended first
        finally:
            stopper.armed = False
            consumer.remove_done_callback(stopper)
            intr.remove_done_callback(stopper)
            batcher.close()  # the session is ending: what was not queued is resent

    def cancel(self) -> None:
        self.call.cancel()
        if self._intr is not None:
            self._intr.cancel()
        if self._ack_later is not None:
            self._ack_later.cancel()


class _Stopper:
    """Cancels the receiving task once, while it is receiving (the module docstring)."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.armed = True
        self.fired = False

    def __call__(self, _: asyncio.Future[Any]) -> None:
        if self.armed and not self.fired:
            self.fired = True
            self.task.cancel()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _message(result: Callable[[], object]) -> pb.PublisherMessage | None:
    """A read's message, None at EOF; a failed read raised as what it means."""
    try:
        msg = result()
    except grpc.aio.AioRpcError as e:
        classify(e.code(), e.details() or "", e.trailing_metadata())
        raise
    if msg is grpc.aio.EOF:
        return None
    assert isinstance(msg, pb.PublisherMessage)
    return msg
