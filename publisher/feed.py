"""One subscriber's feed from one publication: the Sync conversation.

State machine (one feed per Sync stream)::

    HELLO ──refuse──▶ closed with a status (nothing changes)
      │ Hello accepted: registry row ensured, Welcome sent
      ▼
    SYNCING: read the log from level + 1 in large batches, send them
      │ next seq > head, capture not reading a backlog, and the subscriber's
      │ unapplied entries within the queue threshold (else: wait for new entries,
      │ or until it may go in sync; a syncing feed is never cut for its queue)
      ▼ send InSync(head)
    IN_SYNC: wait for new entries (no polling); send them as they become durable;
      │       Heartbeat(head) when idle for heartbeat_s
      ├─ head - acked > queue_threshold ──────▶ CUT "queue threshold"
      ├─ bytes sent, unacked > queue_threshold_bytes (if set) ▶ CUT "queue threshold"
      │    (neither while capture reads a backlog: the head is not live then)
      ├─ a send blocked > send_timeout_s      ──▶ CUT "send timeout"
      └─ shutdown                             ──▶ CUT "publisher shutting down"

Checks on Hello, in order, each with its own status code:
  malformed / not a Hello first ........ INVALID_ARGUMENT
  publisher name mismatch .............. FAILED_PRECONDITION
  unknown publication .................. NOT_FOUND
  incarnation differs .................. FAILED_PRECONDITION (names both ids)
  level > head (subscriber ahead) ...... OUT_OF_RANGE (logged loudly)
  subscriber marked invalid ............ FAILED_PRECONDITION (REFUSAL_KIND_INVALID)
  next entry purged .................... marked invalid, then as above
  head - level > max_delta ............. marked invalid, then as above

Each refusal also carries its RefusalKind, and each cut its CutKind, in the
trailing metadata (common.feedstatus): the subscriber and the metrics read the
kind; the message is for people.

The "queue" of an in-sync feed is the stretch of the log between the level
the subscriber last acknowledged and the head: committed entries it has not yet
applied, whether they still wait in the log or sit in transport buffers (which
HTTP/2 flow control bounds).  Entries wait in the log itself, so a slow feed
costs no memory on the publisher and a cut loses nothing (the subscriber
resumes from its level).  A cut ends the stream with ABORTED, the reason and its
CutKind; it is counted (by kind) and recorded in the registry.

The queue threshold bounds how far a subscriber may trail the *live* stream.
While capture reads a backlog (``Publication.catching_up``: PostgreSQL capture
while the server sends commits a second or more after they were made, e.g. started
after both daemons were down) the head moves at capture's pace, thousands of entries a second, and a
subscriber that applies in large batches trails it by more than the threshold
without being slow.  Before this rule its feed, in sync on reaching the head, was
cut at once, then again after each reconnect and its backoff (W1, four cuts in a
cold restart).  So: a feed goes in sync only when it is at the head, capture is
not reading a backlog and the subscriber's unapplied entries are within the
threshold (sent is not applied); until then it stays syncing, sends each new
entry as it becomes durable, and is never cut for its queue.  An ack that brings
the subscriber within wakes it; the end of capture's backlog is looked for every
``_RECHECK_S`` (no wake comes from the capture thread).  An in-sync feed is not
cut for its queue while capture reads a backlog either: the cut waits for the
live stream, and nothing is held in memory meanwhile (entries wait in the log,
HTTP/2 flow control bounds what is in transit, the send timeout still cuts a
subscriber that stops reading).

Max delta is checked on every sync request.  An operator's mark-valid waives
it once: the subscriber may then catch up however far behind it is, and the
waiver ends when its feed reaches the head.

Hot path: the entries travel as the bytes stored in the log.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from common import trace as _trace
from common.errors import overlong
from common.feedstatus import (
    CUT_PREFIX,
    CutKind,
    cut_metadata,
    refusal_metadata,
)
from common.rpc import txrepl_pb2 as pb
from common.serve import Malformed
from publisher._admission import INVALID_PREFIX, admit, refused
from publisher._waittimer import WaitTimer
from publisher.acks import AckRecorder
from publisher.errors import FeedRefused
from publisher.log import PurgedError
from publisher.publication import Publication
from publisher.sendwatch import SendWatch

if TYPE_CHECKING:  # the registry imports SQLAlchemy: not before capture runs (daemon.py)
    from publisher.registry import Registry

__all__ = ["CUT_PREFIX", "INVALID_PREFIX", "Feed", "FeedManager"]

log = structlog.get_logger(__name__)

# A syncing feed at the head, while capture reads a backlog: how often it looks for the
# backlog's end (to go in sync; the capture thread sends no wake).
_RECHECK_S = 0.05


@dataclass(frozen=True)
class Cut:
    """Why a feed ended: its kind (programs) and its reason (people)."""

    kind: CutKind
    reason: str


@dataclass(eq=False)
class Feed:
    publication: Publication
    subscriber: str
    level: int
    state: str = "syncing"
    last_sent: int = 0
    acked: int = 0
    started: float = field(default_factory=time.time)
    # (last seq of a sent batch, its bytes), oldest first, until acknowledged
    inflight: collections.deque[tuple[int, int]] = field(default_factory=collections.deque)
    inflight_bytes: int = 0
    sends: SendWatch | None = None  # the send timeout (publisher/sendwatch.py)
    # While syncing at the head: the wait an ack wakes when the feed may go in sync.
    waiting: asyncio.Future[int] | None = None
    timer: WaitTimer | None = None  # ends its waits for the head (publisher/_waittimer.py)

    def acknowledge(self, level: int) -> None:
        self.acked = level
        while self.inflight and self.inflight[0][0] <= level:
            self.inflight_bytes -= self.inflight.popleft()[1]


class FeedManager:
    """Serves Sync streams for every publication of this publisher."""

    def __init__(
        self,
        server_name: str,
        publications: Mapping[str, Publication],
        registry: Registry,
        *,
        hello_timeout_s: float = 10.0,
        authorize: Callable[[pb.Hello, Any], None] | None = None,
    ) -> None:
        self.server_name = server_name
        self.publications = publications
        self.registry = registry
        self.hello_timeout_s = hello_timeout_s
        self.authorize = authorize
        self.feeds: set[Feed] = set()
        self.stopping = asyncio.Event()
        self._stop: asyncio.Future[Any] | None = None  # see _stopped()
        self._waits: set[asyncio.Future[int]] = set()  # the feeds' waits for the head

    # -- the RPC --------------------------------------------------------------------

    async def sync(
        self,
        requests: AsyncIterator[pb.SubscriberMessage | Malformed],
        context: grpc.aio.ServicerContext[pb.SubscriberMessage, pb.PublisherMessage],
    ) -> None:
        try:
            first = await asyncio.wait_for(anext(requests), self.hello_timeout_s)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "no Hello within the timeout",
                refusal_metadata(pb.REFUSAL_KIND_HELLO_TIMEOUT),
            )
        except StopAsyncIteration:
            return
        if isinstance(first, Malformed):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"malformed request message: {first.error}",
                refusal_metadata(pb.REFUSAL_KIND_MALFORMED),
            )
        try:
            feed = await self._accept(first, context)
        except FeedRefused as refused:
            log.warning(
                "sync refused",
                code=refused.code.name,
                reason=refused.message,
                subscriber=first.hello.subscriber if first.HasField("hello") else "",
            )
            # set_code + return, not abort(): with client messages still arriving, an
            # abort can surface as INTERNAL "Internal error from Core" instead.
            context.set_code(refused.code)
            context.set_details(refused.message)
            if refused.kind != pb.REFUSAL_KIND_UNSPECIFIED:
                context.set_trailing_metadata(refusal_metadata(refused.kind))
            return
        self.feeds.add(feed)
        recorder = AckRecorder(self.registry, feed.publication.name, feed.subscriber, feed.acked)
        acks = asyncio.create_task(self._read_acks(feed, requests, recorder))
        try:
            cut = await self._stream(feed, context)
            reason = cut.reason if cut else ""
        except asyncio.CancelledError:
            reason = "subscriber went away"
            raise
        finally:
            self.feeds.discard(feed)
            if feed.sends is not None:
                feed.sends.stop()
            if feed.timer is not None:
                feed.timer.cancel()
            acks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acks
            await recorder.close()  # the last level acknowledged, before "disconnected"
            await asyncio.to_thread(
                self.registry.set_state,
                feed.publication.name,
                feed.subscriber,
                "disconnected",
                locals().get("reason") or "stream ended",
            )
        log.info(
            "feed ended",
            publication=feed.publication.name,
            subscriber=feed.subscriber,
            reason=reason,
        )
        if cut:
            # set_code + return rather than abort(): the stream has a reader task that
            # was just cancelled, and the status must still reach the subscriber.
            context.set_code(grpc.StatusCode.ABORTED)
            context.set_details(f"{CUT_PREFIX}: {cut.reason}")
            context.set_trailing_metadata(cut_metadata(cut.kind))

    async def _accept(
        self,
        msg: pb.SubscriberMessage,
        context: grpc.aio.ServicerContext[pb.SubscriberMessage, pb.PublisherMessage],
    ) -> Feed:
        if not msg.HasField("hello"):
            raise refused(pb.REFUSAL_KIND_MALFORMED, "the first message of Sync must be a Hello")
        hello = msg.hello
        problem = overlong(
            subscriber=hello.subscriber,
            publisher=hello.publisher,
            publication=hello.publication,
            incarnation=hello.incarnation,
        )
        if problem:
            raise refused(pb.REFUSAL_KIND_MALFORMED, f"Hello: {problem}")
        if not hello.subscriber or not hello.publication:
            raise refused(
                pb.REFUSAL_KIND_MALFORMED, "Hello needs a subscriber name and a publication"
            )
        if hello.publisher and hello.publisher != self.server_name:
            raise refused(
                pb.REFUSAL_KIND_WRONG_PUBLISHER,
                f"this is publisher {self.server_name!r}, not {hello.publisher!r}: "
                "check the subscription's publisher name and address",
            )
        pub = self.publications.get(hello.publication)
        if pub is None:
            known = ", ".join(sorted(self.publications)) or "none"
            raise refused(
                pb.REFUSAL_KIND_UNKNOWN_PUBLICATION,
                f"publication {hello.publication!r} not found on publisher "
                f"{self.server_name!r} (known: {known})",
            )
        if self.authorize is not None:
            self.authorize(hello, context)
        plog = pub.log
        if hello.incarnation and hello.incarnation != plog.incarnation:
            raise refused(
                pb.REFUSAL_KIND_INCARNATION_CHANGED,
                f"publication {pub.name!r} has incarnation {plog.incarnation}, the subscriber "
                f"has {hello.incarnation}: the publication was re-created; re-initialise the "
                "subscriber",
            )
        head = plog.head
        if hello.level > head:
            log.error(
                "subscriber is ahead of the publication head: the publisher lost data or was "
                "restored from an older backup",
                publication=pub.name,
                subscriber=hello.subscriber,
                sync_level=hello.level,
                head=head,
            )
            raise refused(
                pb.REFUSAL_KIND_AHEAD_OF_HEAD,
                f"subscriber level {hello.level} is ahead of publication {pub.name!r} head "
                f"{head}: the publisher lost entries or was restored; refusing to go back",
            )
        # Admission (the purge checks and the registration) and a retention pass
        # exclude each other (Publication.retention_lock): otherwise a pass that read
        # the registry before this subscriber was registered purges what it needs.
        refusal = await asyncio.to_thread(admit, self.registry, pub, hello)
        if refusal is not None:
            raise refusal
        await asyncio.to_thread(
            self.registry.set_level, pub.name, hello.subscriber, hello.level, plog.incarnation
        )
        await asyncio.to_thread(self.registry.set_state, pub.name, hello.subscriber, "syncing")
        return Feed(
            publication=pub,
            subscriber=hello.subscriber,
            level=hello.level,
            last_sent=hello.level,
            acked=hello.level,
        )

    async def _read_acks(
        self,
        feed: Feed,
        requests: AsyncIterator[pb.SubscriberMessage | Malformed],
        recorder: AckRecorder,
    ) -> None:
        pub = feed.publication
        async for msg in requests:
            if isinstance(msg, Malformed):
                log.warning(
                    "ignoring a malformed message", subscriber=feed.subscriber, error=str(msg.error)
                )
                continue
            if msg.HasField("ack"):
                level = msg.ack.level
                if level > feed.last_sent or level < feed.acked:
                    log.warning(
                        "ignoring an impossible ack",
                        publication=pub.name,
                        subscriber=feed.subscriber,
                        ack=level,
                        sent=feed.last_sent,
                        acked=feed.acked,
                    )
                    continue
                feed.acknowledge(level)
                recorder.ack(level)  # to the registry behind the acks (publisher/acks.py)
                waiting = feed.waiting
                if waiting is not None and _ready(feed, pub.log.head):
                    _settle(waiting)  # syncing at the head, now within: go in sync

    async def _send(
        self,
        feed: Feed,
        context: grpc.aio.ServicerContext[pb.SubscriberMessage, pb.PublisherMessage],
        msg: pb.PublisherMessage,
    ) -> bool:
        """Send one message; False when it blocked past the send timeout."""
        sends = feed.sends
        if sends is None:  # the first send of the feed: watch them from now on
            sends = feed.sends = SendWatch(feed.publication.config.send_timeout_s)
            sends.start()
        return await sends.send(context.write(msg))

    async def _stream(
        self,
        feed: Feed,
        context: grpc.aio.ServicerContext[pb.SubscriberMessage, pb.PublisherMessage],
    ) -> Cut | None:
        """Run the feed; returns the cut, or None when the subscriber left."""
        pub = feed.publication
        cfg = pub.config
        plog = pub.log
        welcome = pb.PublisherMessage()
        welcome.welcome.publisher = self.server_name
        welcome.welcome.publication = pub.name
        welcome.welcome.incarnation = plog.incarnation
        welcome.welcome.head = plog.head
        welcome.welcome.first_retained = plog.first_seq
        welcome.welcome.state = pb.FEED_STATE_SYNCING
        if not await self._send(feed, context, welcome):
            return Cut(pb.CUT_KIND_SEND_TIMEOUT, "send timeout")
        log.info(
            "feed started",
            publication=pub.name,
            subscriber=feed.subscriber,
            sync_level=feed.level,
            head=plog.head,
        )
        next_seq = feed.level + 1
        while not self.stopping.is_set():
            head = plog.head
            if next_seq <= head:
                if (
                    feed.state == "in_sync"
                    and head - feed.acked > cfg.queue_threshold
                    and not pub.catching_up
                ):
                    return self._cut(
                        feed,
                        pb.CUT_KIND_QUEUE_THRESHOLD,
                        f"queue threshold: {head - feed.acked} entries not yet applied "
                        f"> {cfg.queue_threshold}",
                    )
                try:
                    payloads = plog.read(
                        next_seq, max_entries=cfg.batch_entries, max_bytes=cfg.batch_bytes
                    )
                except PurgedError:
                    return self._cut(
                        feed, pb.CUT_KIND_PURGED, f"entry {next_seq} was purged while sending"
                    )
                msg = pb.PublisherMessage()
                msg.batch.first_seq = next_seq
                msg.batch.entries.extend(payloads)
                msg.batch.head = head
                # Counted as sent before the write: the subscriber may ack it before
                # the write returns here, and an ack beyond last_sent is ignored.
                next_seq += len(payloads)
                feed.last_sent = next_seq - 1
                size = sum(map(len, payloads))
                feed.inflight.append((feed.last_sent, size))
                feed.inflight_bytes += size
                tr = _trace.TRACE  # common/trace.py: a diagnostic, off by default
                if tr is None:
                    msg.batch.sent_us = int(time.time() * 1_000_000)  # the "receive" stage
                else:
                    msg.batch.sent_us = pub.traced_send(tr, msg.batch.first_seq, next_seq - 1)
                if not await self._send(feed, context, msg):
                    return self._cut(
                        feed,
                        pb.CUT_KIND_SEND_TIMEOUT,
                        f"send timeout: a send blocked more than {cfg.send_timeout_s}s",
                    )
                pub.sent(msg.batch.first_seq)  # the "send" stage (common/latency.py)
                if (
                    feed.state == "in_sync"
                    and cfg.queue_threshold_bytes
                    and feed.inflight_bytes > cfg.queue_threshold_bytes
                    and not pub.catching_up
                ):
                    return self._cut(
                        feed,
                        pb.CUT_KIND_QUEUE_THRESHOLD,
                        f"queue threshold: {feed.inflight_bytes} bytes sent but not yet applied "
                        f"> {cfg.queue_threshold_bytes}",
                    )
                continue
            if feed.state == "syncing" and _ready(feed, head):
                feed.state = "in_sync"
                msg = pb.PublisherMessage()
                msg.in_sync.head = head
                if not await self._send(feed, context, msg):
                    return self._cut(
                        feed,
                        pb.CUT_KIND_SEND_TIMEOUT,
                        f"send timeout: a send blocked more than {cfg.send_timeout_s}s",
                    )
                await asyncio.to_thread(
                    self.registry.set_state, pub.name, feed.subscriber, "in_sync"
                )
                await asyncio.to_thread(self.registry.end_waiver, pub.name, feed.subscriber)
                log.info(
                    "feed in sync", publication=pub.name, subscriber=feed.subscriber, head=head
                )
            if feed.state == "syncing":
                if await self._wait_syncing(feed, next_seq):
                    continue  # new entries, or it may go in sync now
                new_head = plog.head
            else:
                new_head = await self._wait(feed, next_seq, cfg.heartbeat_s)
            if new_head < next_seq and not self.stopping.is_set():
                msg = pb.PublisherMessage()
                msg.heartbeat.head = new_head
                msg.heartbeat.time_us = int(time.time() * 1_000_000)
                if not await self._send(feed, context, msg):
                    return self._cut(
                        feed,
                        pb.CUT_KIND_SEND_TIMEOUT,
                        f"send timeout: a send blocked more than {cfg.send_timeout_s}s",
                    )
        return self._cut(feed, pb.CUT_KIND_PUBLISHER_SHUTTING_DOWN, "publisher shutting down")

    async def _wait(self, feed: Feed, seq: int, wait_s: float, *, ack_wakes: bool = False) -> int:
        """Wait until the log's head reaches ``seq``, ``wait_s`` passes, or shutdown
        (or, ``ack_wakes``: a syncing feed's ack brings it within the queue threshold).

        Per wait (per entry in sync) a future of the log's head watch, no task and no
        timer of its own (issue 23): the watch, the feed's one timer
        (publisher/_waittimer.py), the shutdown (:meth:`_stopped`) or the feed's ack
        settles the future.
        """
        plog = feed.publication.log
        stop = self._stopped()
        if stop.done():
            return plog.head
        watch = plog.watch()
        fut = watch.future(seq)
        if not fut.done():
            timer = feed.timer
            if timer is None:
                timer = feed.timer = WaitTimer(asyncio.get_running_loop())
            timer.arm(fut, wait_s)
            self._waits.add(fut)
            if ack_wakes:
                feed.waiting = fut
            try:
                await fut
            finally:
                timer.disarm()
                self._waits.discard(fut)
                watch.discard(fut)
                if ack_wakes:
                    feed.waiting = None
        return plog.head

    async def _wait_syncing(self, feed: Feed, seq: int) -> bool:
        """A syncing feed at the head: wait for entry ``seq``, or until the feed may go
        in sync; True then (or at shutdown), False after ``heartbeat_s`` of neither."""
        pub = feed.publication
        deadline = time.monotonic() + pub.config.heartbeat_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # While capture reads a backlog, its end is looked for every _RECHECK_S.
            wait_s = min(left, _RECHECK_S) if pub.catching_up else left
            head = await self._wait(feed, seq, wait_s, ack_wakes=True)
            if head >= seq or self.stopping.is_set() or _ready(feed, head):
                return True

    def _stopped(self) -> asyncio.Future[Any]:
        """Done once ``stopping`` is set, and then settles every feed's wait: one for
        all the feeds, rather than a task made and cancelled per wait."""
        if self._stop is None or self._stop.get_loop() is not asyncio.get_running_loop():
            self._stop = asyncio.ensure_future(self.stopping.wait())
            self._stop.add_done_callback(self._stop_waits)
        return self._stop

    def _stop_waits(self, _: asyncio.Future[Any]) -> None:
        for fut in list(self._waits):
            _settle(fut)

    def _cut(self, feed: Feed, kind: CutKind, reason: str) -> Cut:
        pub = feed.publication
        log.warning(
            "feed cut",
            publication=pub.name,
            subscriber=feed.subscriber,
            reason=reason,
            kind=pb.CutKind.Name(kind),
            sent=feed.last_sent,
            acked=feed.acked,
            head=pub.log.head,
        )
        self.registry.record_cut(pub.name, feed.subscriber, kind, reason)
        if _trace.TRACE is not None:
            _trace.TRACE.event("cut", subscriber=feed.subscriber, reason=reason)
        return Cut(kind, reason)


def _ready(feed: Feed, head: int) -> bool:
    """Whether a syncing ``feed`` at ``head`` may go in sync: capture is not reading a
    backlog and the subscriber's queue (sent or not, not yet applied) is within the
    threshold, so that being in sync does not mean being cut at the next entry."""
    pub = feed.publication
    cfg = pub.config
    return (
        not pub.catching_up
        and head - feed.acked <= cfg.queue_threshold
        and not (cfg.queue_threshold_bytes and feed.inflight_bytes > cfg.queue_threshold_bytes)
    )


def _settle(fut: asyncio.Future[int]) -> None:
    """End a feed's wait for the head (its timeout, or shutdown)."""
    if not fut.done():
        fut.set_result(0)
