"""One subscription's supervisor: connect, run a session, decide what comes next.

A session is one Sync stream, three stages and their shared state::

    FeedStream.receive ─▶ Batcher (bounded) ─▶ ApplyPipeline ─▶ target
         (stream.py)       (batcher.py)          (pipeline.py)
                   └─────── SubscriptionState (state.py) ───────┘

:meth:`SubscriptionRunner.run` loops over sessions.  How one ends decides the
next state (the diagram is in subscriber.state; the errors in subscriber.errors):

    scheduled run reached the head ... ``scheduled`` until the next time
    stream ended, FeedEnded, grpc error, unexpected exception
                                   ... ``disconnected``, reconnect after a backoff
                                       (common.backoff; reset after progress)
    SnapshotRequired ............... load a snapshot, then reconnect at once
    Interrupted .................... reconnect at once (or stay paused/stopped)
    InvalidSubscriber .............. ``invalid``, until an operator's reconnect
    ``retry_budget`` failures in a row ``broken``, until an operator's unbreak
    GapError, TransientError (apply) ``disconnected``: the next session resumes from
                                       the level read back from the target
    PermanentFeedError, ApplyError . ``error``, until an operator's reconnect

When a session ends, the batch being applied finishes (a thread cannot be
cancelled); everything received after it is dropped, and the next Hello resumes
from the applied level (the exactly-once argument is in subscriber.pipeline).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import time
from collections.abc import Callable

import grpc
import structlog

from common.backoff import Backoff
from common.exits import rpc_failure
from common.latency import StageLatency
from common.rpc import txrepl_pb2 as pb
from common.security import aio_channel_factory
from common.serve import freeze_settled_heap
from subscriber.apply import Applier, ApplyError, GapError, TransientError
from subscriber.batcher import Batcher
from subscriber.config import BatchConfig, SubscriptionConfig
from subscriber.errors import (
    FeedEnded,
    Interrupted,
    InvalidSubscriber,
    PermanentFeedError,
    SnapshotRequired,
)
from subscriber.pipeline import ApplyPipeline
from subscriber.reinit import SnapshotRefused
from subscriber.schedule import Clock, SystemClock
from subscriber.state import STATES, SubscriptionState
from subscriber.stream import FeedStream

__all__ = ["STATES", "SubscriptionRunner"]

log = structlog.get_logger(__name__)

_LONG = 3600  # seconds to wait for an operator (cut short by reconnect/resume/stop)


class SubscriptionRunner:
    """Keeps one subscription connected, applying, and observable."""

    def __init__(
        self,
        config: SubscriptionConfig,
        subscriber_name: str,
        applier: Applier,
        *,
        batch: BatchConfig,
        backoff: Backoff,
        channel_factory: Callable[[str], grpc.aio.Channel] | None = None,
        clock: Clock | None = None,
        snapshot: Callable[[], tuple[str, int]] | None = None,
        stages: StageLatency | None = None,
    ) -> None:
        self.config = config
        # Per-stage latency (common/latency.py): the daemon's, exported; else counted only.
        self.stages = stages or StageLatency("txrepl_subscription_stage_seconds", "subscription")
        self.name = config.id
        self.subscriber_name = subscriber_name
        self.applier = applier
        self.batch = batch
        self.backoff = backoff
        # Plaintext unless the caller (the daemon) passes its factory with TLS; the
        # subscription's token on every call either way.
        self.channel_factory = channel_factory or aio_channel_factory(None, token=config.token)
        st = applier.load_state()
        applier.read_target_node()  # for status() (docs/topologies.md); apply re-reads
        self.st = SubscriptionState(self.name, st.level, st.incarnation)
        self._paused = False
        self._broken = False
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._interrupted = asyncio.Event()
        self.clock: Clock = clock or SystemClock()
        self.snapshot = snapshot  # loads a snapshot into the target: (incarnation, seq)
        self.schedule = config.schedule
        self.last_run_start: float | None = None
        self.next_run: float | None = None
        self.runs = 0
        self._run_done = False
        # The applies of every session run on this one thread (subscriber/pipeline.py).
        self._apply_thread: concurrent.futures.ThreadPoolExecutor | None = None

    # -- what callers read (metrics, tests; the rest through status()) ------------------

    @property
    def state(self) -> str:
        return self.st.state

    @property
    def level(self) -> int:
        return self.st.level

    @property
    def head(self) -> int:
        return self.st.head

    @property
    def timeline(self) -> list[tuple[float, str, str]]:
        return self.st.timeline

    @property
    def applied_entries(self) -> int:
        return self.st.applied_entries

    @property
    def applied_rows(self) -> int:
        return self.st.applied_rows

    def status(self) -> pb.SubscriptionStatus:
        st = self.st.status(self.config.publisher, self.config.publication)
        st.target_node = self.applier.target_node
        for table, n in sorted(self.conflicts().items()):
            st.conflicts.add(table=table, count=n)
        return st

    def conflicts(self) -> dict[str, int]:
        """Conflicts of an updatable subscription, per table (its writer's guard)."""
        guard = getattr(getattr(self.applier, "_writer", None), "conflicts", None)
        if guard is None:
            return {}
        return {t: n for (_, t), n in guard.counts(self.config.id).items()}

    # -- control --------------------------------------------------------------------

    def pause(self) -> None:
        self._paused = True
        self._interrupt()
        self.st.set("paused", "paused by operator")

    def resume(self) -> None:
        self._paused = False
        if self.st.state == "paused":
            self.st.set("disconnected", "resumed by operator")
        self._wake.set()

    def reconnect(self) -> None:
        """Drop the current connection (if any) and connect again now."""
        self._paused = False
        self._interrupt()
        self._wake.set()

    def unbreak(self) -> None:
        """A broken subscription tries again now, with its full retry budget."""
        if self._broken:
            self._broken = False
            self.st.set("disconnected", "unbroken by operator")
            self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._interrupt()
        self._wake.set()

    def _interrupt(self) -> None:
        # Not call.cancel(): that raises CancelledError in the awaiting task, which
        # must stay reserved for the task's own cancellation.
        self._interrupted.set()

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
            self.st.set("scheduled", f"next run at {at}")
            self._wake.clear()
            await self.clock.sleep(self.next_run - now, self._wake)
        self.last_run_start = self.clock.now()

    # -- main loop ------------------------------------------------------------------------

    async def run(self) -> None:
        st = self.st
        failures = 0
        while not self._stop.is_set():
            if self._paused:
                await self._sleep(_LONG)
                continue
            if self.schedule.enabled and failures == 0:
                await self._wait_for_schedule()
                if self._stop.is_set() or self._paused:
                    continue
            self._run_done = False
            self._interrupted.clear()
            st.set("connecting", f"to {self.config.publisher} at {self.config.address}")
            progressed = False
            try:
                progressed = await self._session()
                if self._run_done:
                    # A scheduled run reached the head: disconnect until the next time.
                    self.runs += 1
                    failures = 0
                    continue
                if not self._stop.is_set() and not self._paused:
                    st.set("disconnected", "stream ended")
            except SnapshotRequired as e:
                if self.snapshot is None or self.config.initial == "log":
                    st.fail("error", f"{e}; this target cannot load snapshots")
                    await self._sleep(_LONG)
                    continue
                try:
                    await self._load_snapshot(str(e))
                except SnapshotRefused as err:
                    # The configuration, not the moment: waits for an operator.
                    st.fail("error", str(err))
                    await self._sleep(_LONG)
                    continue
                except Exception as err:
                    st.fail("disconnected", f"snapshot failed: {err}")
                    failures += 1
                    await self._sleep(self.backoff.delay(failures, random.random()))
                continue
            except Interrupted:
                if not self._paused and not self._stop.is_set():
                    st.set("disconnected", "reconnect requested")
                failures = 0
                continue
            except InvalidSubscriber as e:
                st.fail("invalid", str(e))
                log.error(
                    "subscriber is invalid: re-initialise the target, have the publisher's "
                    "operator run 'txrepl admin mark-valid', then 'txrepl subscriber reconnect'",
                    subscription=self.name,
                    reason=str(e),
                )
                await self._sleep(_LONG)
                continue
            except PermanentFeedError as e:
                st.fail("error", str(e))
                await self._sleep(_LONG)
                continue
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED and (self._paused or self._stop.is_set()):
                    continue
                # A TLS mismatch with the publisher says so (common/exits.py; it may
                # probe the address once, off the event loop).
                plaintext = self.config.client_tls is None
                line, _ = await asyncio.to_thread(rpc_failure, e, plaintext=plaintext)
                st.fail("disconnected", line)
            except (FeedEnded, ConnectionError) as e:  # refused for now (cut, unknown publication)
                log.warning("sync ended", subscription=self.name, reason=str(e))
                st.fail("disconnected", str(e))
            except (GapError, TransientError) as e:
                # The target is the truth: it is down for now, or it lost commits it
                # had not flushed (a crash: subscriber/targets/postgres/_durable.py) and
                # the level applied here is ahead of it.  The next session reads its
                # level back and resumes from there.
                st.fail("disconnected", f"apply failed: {e}")
            except ApplyError as e:
                st.fail("error", f"apply failed: {e}")
                await self._sleep(_LONG)
                continue
            except Exception as e:  # a bug or an unexpected failure: keep trying, loudly
                log.exception("subscription failed", subscription=self.name)
                st.fail("disconnected", f"{type(e).__name__}: {e}")
            if self._stop.is_set():
                break
            failures = 1 if progressed else failures + 1
            if 0 < self.config.retry_budget <= failures:
                await self._broken_until_unbreak(failures)
                failures = 0
                continue
            delay = self.backoff.delay(failures, random.random())
            log.info("reconnecting", subscription=self.name, in_s=round(delay, 2), attempt=failures)
            await self._sleep(delay)
        st.set("disconnected", "stopped")
        if self._apply_thread is not None:
            self._apply_thread.shutdown(wait=False)  # idle: every session's apply has ended
            self._apply_thread = None

    async def _broken_until_unbreak(self, failures: int) -> None:
        st = self.st
        self._broken = True
        st.fail("broken", f"{failures} attempts in a row failed; last: {st.last_error}")
        log.error(
            "subscription broken: its retry budget is spent; fix the cause, then "
            "'txrepl subscriber unbreak'",
            subscription=self.name,
            attempts=failures,
            last_error=st.last_error,
        )
        while self._broken and not self._stop.is_set():
            await self._sleep(_LONG)

    async def _load_snapshot(self, reason: str) -> None:
        assert self.snapshot is not None
        self.st.set("syncing", f"loading a snapshot ({reason})")
        incarnation, seq = await asyncio.to_thread(self.snapshot)
        self.applier.load_state()
        self.st.level, self.st.incarnation = seq, incarnation
        log.info("snapshot loaded", subscription=self.name, sync_level=seq)

    async def _session(self) -> bool:
        """One connection; returns True if anything was applied."""
        st = self.st
        # The target is the truth: an operator's reinit may have moved the level.
        stored = await asyncio.to_thread(self.applier.load_state)
        st.level, st.incarnation = stored.level, stored.incarnation
        if st.level == 0 and not st.incarnation and self.config.initial == "snapshot":
            raise SnapshotRequired('initial = "snapshot"')
        async with self.channel_factory(self.config.address) as channel:
            stream = FeedStream(
                channel,
                self.config,
                self._interrupted,
                ack_interval=self.batch.ack_interval_ms / 1000,
            )
            try:
                welcome = await stream.hello(self.subscriber_name, st)
                st.in_sync_head = None
                st.sessions += 1
                st.set("syncing", f"level {st.level}, head {welcome.head}")
                batcher = Batcher(self.batch, st, self._interrupted)
                if self._apply_thread is None:
                    self._apply_thread = concurrent.futures.ThreadPoolExecutor(
                        1, thread_name_prefix=f"apply {self.name}"
                    )
                pipeline = ApplyPipeline(
                    self.applier,
                    self.batch,
                    st,
                    batcher,
                    stream,
                    on_in_sync=lambda: self._at_head(batcher),
                    stages=self.stages,
                    scheduled=self.schedule.enabled,
                    apply_thread=self._apply_thread,
                )
                applier = asyncio.create_task(pipeline.run())
                try:
                    await stream.receive(
                        st, batcher, applier, lambda: self._at_head(batcher), self.stages
                    )
                finally:
                    if not applier.done():
                        # Let the batch in flight finish (a thread cannot be cancelled),
                        # drop the rest: the next Hello resumes from the applied level.
                        pipeline.ending = True  # a batch planned ahead is not applied
                        batcher.drop()
                        with contextlib.suppress(Exception):
                            await applier
                    if applier.done() and not applier.cancelled():
                        exc = applier.exception()
                        if exc is not None:
                            raise exc
            finally:
                stream.cancel()
        return st.applied_entries > 0

    def _at_head(self, batcher: Batcher) -> bool:
        """Our level reached the head of an InSync: in sync; True if the session ends."""
        self.st.enter_in_sync()
        freeze_settled_heap()
        if self.schedule.enabled and not self._run_done:
            self._run_done = True
            batcher.end()  # the applier returns; the session ends
        return self._run_done
