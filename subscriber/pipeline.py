"""The apply pipeline of one session: take a batch, plan it, apply it, ack it.

Loop::

    gather (batcher) ─▶ plan ─▶ apply: rows + level in one target transaction
         ▲                              │
         └── ack(level) to the publisher ◀┘   then: in sync? a scheduled run ends

Plan ahead (``plan_ahead``, while syncing): while batch *n* is written to the
target, batch *n+1*, if it is already waiting in the queue, is taken and planned
in another thread against *n*'s schemas (:meth:`Applier.plan`).  Nothing of
*n+1* reaches the target before *n* commits: its write starts after, and
re-checks the level in its own transaction.  If *n* fails, *n+1*'s plan is
dropped with the session (the next Hello resumes from the applied level).

Exactly once: the level lives in the target, written in the same transaction as
the rows (subscriber/apply).  After any disconnect, batches received but not yet
applied are dropped (:meth:`Batcher.drop`, :attr:`ApplyPipeline.ending`) and the
next Hello carries the applied level, so the publisher resends from level + 1.
A gap (first seq != expected) is refused by the stream before it gets here.
The ack only lets the publisher's retention and status move on: a lost ack
loses nothing.  An ack never runs ahead of what the target holds durably
(subscriber/acks.py: a PostgreSQL target may commit asynchronously).  Acks are
coalesced to at most one per few milliseconds, the latest level
(:meth:`FeedStream.ack`); the pipeline's end sends a pending one.

Latency (issue 23): a batch is gathered the moment anything is queued
(natural batching, subscriber.batcher) and applied at once; each applied batch
observes the ``queue``, ``apply``, ``commit`` and ``total`` stages
(common/latency.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from common.latency import StageLatency
from subscriber._applythread import ApplyThread
from subscriber.acks import DurableAcks
from subscriber.apply import AnyEntry, Applier, ApplyResult, Planned, RawEntry
from subscriber.batcher import Batcher
from subscriber.config import BatchConfig
from subscriber.state import SubscriptionState
from subscriber.stream import FeedStream

__all__ = ["ApplyPipeline"]

log = structlog.get_logger(__name__)


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
    ) -> None:
        self.stages = stages
        self.applier = applier
        self.batch = batch
        self.state = state
        self.batcher = batcher
        self.stream = stream
        self.on_in_sync = on_in_sync  # True: the session ends (a scheduled run is done)
        self.ending = False  # the session is ending: stop between batches

    async def run(self) -> None:
        """Apply batches until the batcher ends the session (or an apply fails)."""
        batcher, st = self.batcher, self.state
        acks = DurableAcks(self.applier, self.stream, st.level)
        ahead: (
            tuple[int, int, bool, float, asyncio.Future[tuple[list[AnyEntry], Planned]]] | None
        ) = None
        # The applies run on one thread of the session's own (subscriber/_applythread.py);
        # the plans made ahead, while syncing, on the default executor's, beside them.
        worker: ApplyThread | None = None
        try:
            while True:
                planned: Planned | None = None
                if ahead is not None:
                    if self.ending:
                        return  # dropped with the queue: resent after the next Hello
                    first_seq, size, hold, received_at, planning = ahead
                    ahead = None
                    started = time.monotonic()
                    entries, planned = await planning
                else:
                    got = await batcher.gather()
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
                        entries, planned = await asyncio.to_thread(
                            self._parse_and_plan, first_seq, payloads, None
                        )
                    else:
                        entries = _entries(payloads)
                # ``hold`` only when set: an applier standing in for the real one (a
                # test's) needs to know of groups only when it is given one.
                more: dict[str, bool] = {"hold": True} if hold else {}
                if worker is None:
                    worker = ApplyThread(f"apply {st.name}")
                writing = worker.submit(
                    self.applier.apply,
                    first_seq,
                    entries,
                    incarnation=st.incarnation,
                    planned=planned,
                    **more,
                )
                if planned is not None and planned.error is None and not batcher.pending():
                    await asyncio.sleep(0)  # let the receive loop queue what it holds
                if planned is not None and planned.error is None and batcher.pending():
                    got = await batcher.gather()
                    if got is None:
                        batcher.again()  # seen again once this batch is acked
                    else:
                        nxt_first, nxt_payloads, nxt_size, nxt_hold = got
                        ahead = (
                            nxt_first,
                            nxt_size,
                            nxt_hold,
                            batcher.received_at,
                            asyncio.ensure_future(
                                asyncio.to_thread(
                                    self._parse_and_plan, nxt_first, nxt_payloads, planned
                                )
                            ),
                        )
                result = await writing
                if hold:
                    continue  # a piece of a group: the level moves with its last piece
                now = time.time()
                if self.stages is not None and entries:
                    self._observe(entries, received_at, started, result, now)
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
                await acks.applied(st.level)
                if st.at_head() and self.on_in_sync():
                    return
        finally:
            try:
                await acks.close()  # levels still waiting for the target's flush: not acked
                # Acks are coalesced (subscriber/stream.py): the last level goes out now.
                await self.stream.flush_acks()
                if ahead is not None:
                    # A plan thread cannot be cancelled: let it end before the session does.
                    with contextlib.suppress(BaseException):
                        await ahead[4]
                if self._holding():
                    # A group handed out in pieces was not finished: nothing of it stays
                    # (the next session sends it again from its first fragment).  On the
                    # apply thread, after the apply in hand if the session was cancelled.
                    if worker is None:
                        await asyncio.to_thread(self.applier.abandon)
                    else:
                        await worker.submit(self.applier.abandon)
            finally:
                if worker is not None:
                    worker.close()  # the thread ends after its last job

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
