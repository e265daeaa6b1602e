"""The apply pipeline of one session: take a batch, plan it, apply it, ack it.

Loop, on the session's apply thread::

    take (batcher) ─▶ plan ─▶ apply: rows + level in one target transaction
         ▲                              │
         └── ack(level) to the publisher ◀┘   then: in sync? a scheduled run ends

One thread per session runs the whole loop (issue 23): it takes the next batch
from the batcher itself (blocking while nothing is queued), so the event loop is
woken per batch only by gRPC delivering the entry, not also by each apply's end
and the hand-over of the next batch.  The loop hears from the thread only when it
must act:

* an ack: the thread offers the durable level to the stream's ack writer
  (:meth:`FeedStream.offer_ack`), which is started on the loop only when none is
  running; a running one sends the latest level when its interval ends;
* a PostgreSQL level still waiting for the target's WAL flush: the poller
  (subscriber/acks.py) is started on the loop when none runs;
* the head reached while not yet ``in_sync``, or in a scheduled run:
  ``on_in_sync`` runs on the loop (state transitions stay on the loop) and the
  thread waits for its answer; in sync, an unscheduled session skips it;
* the end: :meth:`run` awaits one future that the thread settles when it
  returns, with its exception if an apply failed.

The thread is the subscription's, kept between its sessions (a one-thread executor
the runner owns, ``apply_thread``): whatever is kept per thread (the stage
observations' cells, common/latency.py) does not grow with each reconnect.

What the thread shares with the loop: the batcher (its own lock), the state's
``level`` / counters (written by this thread only, read by the loop's status),
``ending`` (set by the loop, read between batches), the stage observations and
the log line (each thread-safe).  Nothing the loop awaits ever waits for this
thread while holding something the thread needs, so the thread's wait for
``on_in_sync`` cannot deadlock.

Ending: the session ends when the thread returns (the batcher's end mark, a
scheduled run's head, ``ending``, an error).  On its way out it drops the batcher's
queue (nothing more is applied in this session) and abandons a group held open.
When :meth:`run` is cancelled, it sets ``ending`` and drops the queue, then waits
for the batch in hand (a target transaction cannot be stopped half way).

Plan ahead (``plan_ahead``, while syncing): while batch *n* is written to the
target, batch *n+1*, if it is already waiting in the queue, is taken and planned
on a second thread against *n*'s schemas (:meth:`Applier.plan`).  Nothing of
*n+1* reaches the target before *n* commits: its write starts after, on this
thread, and re-checks the level in its own transaction.  If *n* fails, *n+1*'s
plan is dropped with the session (the next Hello resumes from the applied level).

Exactly once: the level lives in the target, written in the same transaction as
the rows (subscriber/apply).  After any disconnect, batches received but not yet
applied are dropped (:meth:`Batcher.drop`, :attr:`ApplyPipeline.ending`) and the
next Hello carries the applied level, so the publisher resends from level + 1.
A gap (first seq != expected) is refused by the stream before it gets here.
The ack only lets the publisher's retention and status move on: a lost ack
loses nothing.  An ack never runs ahead of what the target holds durably
(subscriber/acks.py: a PostgreSQL target may commit asynchronously).  Acks are
coalesced to at most one per few milliseconds, the latest level; the pipeline's
end sends a pending one.

Latency (issue 23): a batch is taken the moment anything is queued
(natural batching, subscriber.batcher) and applied at once; each applied batch
observes the ``queue``, ``apply``, ``commit`` and ``total`` stages
(common/latency.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Callable

import structlog

from common import trace as _trace
from common.latency import StageLatency
from subscriber.acks import DurableAcks
from subscriber.apply import AnyEntry, Applier, ApplyResult, Planned, RawEntry
from subscriber.batcher import Batcher
from subscriber.config import BatchConfig
from subscriber.state import SubscriptionState
from subscriber.stream import FeedStream

__all__ = ["ApplyPipeline"]

log = structlog.get_logger(__name__)

# A batch taken and planned ahead: (first seq, bytes, open, received at, entries, plan).
_Ahead = tuple[int, int, bool, float, list[AnyEntry], Planned]


def _entries(payloads: list[bytes]) -> list[AnyEntry]:
    # Parsed lazily: the apply walks the bytes (subscriber.apply.entry).
    return [RawEntry(p) for p in payloads]


class ApplyPipeline:
    """Applies a session's batches in order and acks each once committed."""

    def __init__(
        self,
        applier: Applier,
        batch: BatchConfig,
        state: SubscriptionState,
        batcher: Batcher,
        stream: FeedStream,
        on_in_sync: Callable[[], bool],
        stages: StageLatency | None = None,
        *,
        scheduled: bool = False,
        apply_thread: concurrent.futures.ThreadPoolExecutor | None = None,
    ) -> None:
        self.stages = stages
        self.applier = applier
        self.batch = batch
        self.state = state
        self.batcher = batcher
        self.stream = stream
        self.on_in_sync = on_in_sync  # True: the session ends (a scheduled run is done)
        self.scheduled = scheduled  # on_in_sync may end the session: ask it at each head
        self.ending = False  # the session is ending: stop between batches
        # One worker, the subscription's (the module docstring); else one of this run's.
        self.apply_thread = apply_thread

    async def run(self) -> None:
        """Apply batches until the batcher ends the session (or an apply fails)."""
        loop = asyncio.get_running_loop()
        acks = DurableAcks(self.applier, self.stream, self.state.level)
        finished: asyncio.Future[None] = loop.create_future()
        own = None
        worker = self.apply_thread
        if worker is None:
            worker = own = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"apply {self.state.name}"
            )
        worker.submit(self._thread, loop, finished, acks)
        try:
            await asyncio.shield(finished)
        finally:
            try:
                if not finished.done():
                    # Cancelled: the thread stops after the batch in hand.
                    self.ending = True
                    self.batcher.drop()
                    await asyncio.wait({finished})
                    if not finished.cancelled():
                        finished.exception()  # retrieved: the cancellation goes up instead
            finally:
                if own is not None:
                    own.shutdown(wait=False)  # its thread ends once _thread returned
                await acks.close()  # levels still waiting for the target's flush: not acked
                # Acks are coalesced (subscriber/stream.py): the last level goes out now.
                await self.stream.flush_acks()

    def _thread(
        self, loop: asyncio.AbstractEventLoop, finished: asyncio.Future[None], acks: DurableAcks
    ) -> None:
        error: BaseException | None = None
        try:
            self._apply_all(loop, acks)
        except BaseException as e:  # handed to run(), as the executor did
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            loop.call_soon_threadsafe(_settle, finished, error)

    def _apply_all(self, loop: asyncio.AbstractEventLoop, acks: DurableAcks) -> None:
        batcher, st = self.batcher, self.state
        ahead: concurrent.futures.Future[_Ahead | None] | None = None
        planner: concurrent.futures.ThreadPoolExecutor | None = None
        try:
            while True:
                planned: Planned | None = None
                if ahead is not None:
                    if self.ending:
                        return  # dropped with the queue: resent after the next Hello
                    nxt, ahead = ahead.result(), None
                    if nxt is None:
                        return
                    first_seq, size, hold, received_at, entries, planned = nxt
                    started = time.monotonic()
                else:
                    got = batcher.take()
                    if got is None:
                        return
                    first_seq, payloads, size, hold = got
                    received_at = batcher.received_at
                    started = time.monotonic()
                    if (
                        not hold
                        and not self._holding()
                        and self.batch.plan_ahead
                        and st.state == "syncing"
                        and st.head >= first_seq + len(payloads)
                    ):
                        # More is coming: plan this one first, so the next can plan
                        # while this one writes.
                        entries, planned = self._parse_and_plan(first_seq, payloads, None)
                    else:
                        entries = _entries(payloads)
                if planned is not None and planned.error is None and batcher.pending():
                    if planner is None:
                        planner = concurrent.futures.ThreadPoolExecutor(
                            1, thread_name_prefix=f"plan {st.name}"
                        )
                    ahead = planner.submit(self._take_and_plan, planned)
                # ``hold`` only when set: an applier standing in for the real one (a
                # test's) needs to know of groups only when it is given one.
                more: dict[str, bool] = {"hold": True} if hold else {}
                result = self.applier.apply(
                    first_seq, entries, incarnation=st.incarnation, planned=planned, **more
                )
                if hold:
                    continue  # a piece of a group: the level moves with its last piece
                self._applied(entries, first_seq, size, received_at, started, result)
                acks.applied(st.level)
                if (
                    st.at_head()
                    and (self.scheduled or not st.in_sync)
                    and _on_loop(loop, self.on_in_sync)
                ):
                    return
        finally:
            # Nothing more is applied in this session; a take waiting (the plan ahead's)
            # returns at once.
            batcher.drop()
            if ahead is not None:
                # A plan cannot be cancelled: let it end before the session does.
                with contextlib.suppress(BaseException):
                    ahead.result()
            if planner is not None:
                planner.shutdown(wait=False)
            if self._holding():
                # A group handed out in pieces was not finished: nothing of it stays
                # (the next session sends it again from its first fragment).
                self.applier.abandon()

    def _applied(
        self,
        entries: list[AnyEntry],
        first_seq: int,
        size: int,
        received_at: float,
        started: float,
        result: ApplyResult,
    ) -> None:
        """One batch committed: the state, the stages, the batch's log line."""
        st = self.state
        now = time.time()
        if self.stages is not None and entries:
            self._observe(entries, received_at, started, result, now)
        if _trace.TRACE is not None and entries:  # common/trace.py, a diagnostic
            write = result.seconds - (0.0 if result.planned_ahead else result.plan_seconds)
            _trace.TRACE.applied(first_seq, len(entries), started, write, now)
        st.level = result.level
        st.applied_entries += len(entries)
        st.applied_rows += result.rows
        log.info(
            "batch applied",
            subscription=st.name,
            first_seq=first_seq,
            sync_level=st.level,
            entries=len(entries),
            rows=result.rows,
            bytes=size,
            seconds=round(time.monotonic() - started, 4),
            plan_seconds=round(result.plan_seconds, 4),
            # the apply call itself: the write, and the plan unless made ahead
            apply_seconds=round(result.seconds, 4),
            planned_ahead=result.planned_ahead,
            head=st.head,
            # source commit -> applied here, of the batch's newest and oldest entry
            lag_ms=round((now - entries[-1].commit_time_us / 1e6) * 1000, 1),
            oldest_ms=round((now - entries[0].commit_time_us / 1e6) * 1000, 1),
        )

    def _observe(
        self,
        entries: list[AnyEntry],
        received_at: float,
        started: float,
        result: ApplyResult,
        now: float,
    ) -> None:
        """One applied batch's ``queue``, ``apply``, ``commit`` and ``total`` stages."""
        stages, name = self.stages, self.state.name
        assert stages is not None
        stages.observe(name, "queue", started - received_at)
        # The apply call's time less its planning is the target transaction (when the
        # plan was made ahead, the call was the write alone).
        plan = 0.0 if result.planned_ahead else result.plan_seconds
        stages.observe(name, "apply", result.plan_seconds)
        stages.observe(name, "commit", result.seconds - plan)
        stages.observe(name, "total", now - entries[0].commit_time_us / 1e6)

    def _holding(self) -> bool:
        """The applier holds a group's target transaction open (subscriber/apply/_pieces.py)."""
        return bool(getattr(self.applier, "holding", False))

    def _parse_and_plan(
        self, first_seq: int, payloads: list[bytes], after: Planned | None
    ) -> tuple[list[AnyEntry], Planned]:
        entries = _entries(payloads)
        return entries, self.applier.plan(first_seq, entries, after=after)

    def _take_and_plan(self, after: Planned) -> _Ahead | None:
        """On the plan thread: the next batch, planned against ``after``'s schemas."""
        got = self.batcher.take()
        if got is None:
            return None
        first_seq, payloads, size, hold = got
        received_at = self.batcher.received_at
        entries, planned = self._parse_and_plan(first_seq, payloads, after)
        return first_seq, size, hold, received_at, entries, planned


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], bool]) -> bool:
    """``fn()`` run on the event loop, from the apply thread; its answer."""
    answer: concurrent.futures.Future[bool] = concurrent.futures.Future()

    def call() -> None:
        try:
            answer.set_result(fn())
        except BaseException as e:
            answer.set_exception(e)

    loop.call_soon_threadsafe(call)
    return answer.result()


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
