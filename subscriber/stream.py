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

How a stream ended decides what the subscription does next (:func:`classify`):
the publisher's RefusalKind, sent in the trailing metadata (common.feedstatus),
names the refusal; without one (a refusal from outside the feed, a lost
connection) the status code decides.  Never the text of the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc

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

__all__ = ["REFUSALS", "FeedStream", "classify"]

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
        self, channel: grpc.aio.Channel, config: SubscriptionConfig, interrupted: asyncio.Event
    ) -> None:
        self.config = config
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

    async def read(self, consumer: asyncio.Task[None] | None = None) -> pb.PublisherMessage | None:
        """The next message; None at EOF or when ``consumer`` (the apply) ended first."""
        read = asyncio.ensure_future(self.call.read())
        intr = self._intr
        if intr is None or intr.done():
            intr = self._intr = asyncio.ensure_future(self._interrupted.wait())
        waits: set[asyncio.Future[Any]] = {read, intr}
        if consumer is not None:
            waits.add(consumer)
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if read in done:
            try:
                msg = read.result()
            except grpc.aio.AioRpcError as e:
                classify(e.code(), e.details() or "", e.trailing_metadata())
                raise
            if msg is grpc.aio.EOF:
                return None
            assert isinstance(msg, pb.PublisherMessage)
            return msg
        read.cancel()
        if intr in done and self._interrupted.is_set():
            raise Interrupted()
        return None

    async def raise_status(self) -> None:
        """Raise what the ended stream's status means (nothing if OK)."""
        call = self.call
        classify(await call.code(), await call.details() or "", await call.trailing_metadata())

    async def ack(self, level: int) -> None:
        """Tell the publisher ``level`` is applied (best effort: a lost ack is resent)."""
        ack = pb.SubscriberMessage()
        ack.ack.level = level
        with contextlib.suppress(Exception):
            await self.call.write(ack)

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
        try:
            while True:
                msg = await self.read(consumer)
                if msg is None:
                    if not consumer.done():
                        await self.raise_status()
                    return
                kind = msg.WhichOneof("kind")
                if kind == "batch":
                    b = msg.batch
                    if stages is not None and b.sent_us:
                        stages.observe(state.name, "receive", time.time() - b.sent_us / 1e6)
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
        finally:
            batcher.close()  # the session is ending: what was not queued is resent

    def cancel(self) -> None:
        self.call.cancel()
        if self._intr is not None:
            self._intr.cancel()
