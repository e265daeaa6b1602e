"""Acks of durable levels only: what the publisher is told the target holds.

An ack lets the publisher's retention drop the entries up to its level, so a level
is acknowledged only once the target holds it durably.  Most targets commit
durably (the level is acknowledged after each batch, as before); a PostgreSQL
target committing asynchronously (subscriber/targets/postgres/_durable.py) holds a
level durably once its WAL is flushed past the batch's commit, some milliseconds
to ``wal_writer_delay`` later.

:meth:`DurableAcks.applied` (after each batch, on the session's apply thread,
subscriber/pipeline.py) acknowledges what the writer already knows durable (the
flushed LSN each batch brings back: no wait, no query) and, while levels wait, a
task on the event loop looks again after ``POLL_S``
(doubling up to ``MAX_POLL_S`` while nothing new is durable): at what the batches
of that time brought, or, when none came, asks the writer in a thread
(:meth:`Applier.durable_level` with ``poll``: a query only when the writer is
idle).  The apply never waits for an ack.  Acks go out in level order, one write
at a time (the stream's writer sends the highest level offered).

Two threads: the apply thread calls :meth:`applied`, the poller runs on the loop.
``sent``, the applied level and whether a poller runs are read and written under
one lock.  The thread starts a poller (one ``call_soon_threadsafe``) only when
none runs; a poller ends only when, under the lock, no level was applied since
its last look, so a level applied while it ends starts a new one: a waiting level
is always looked at again.  A level still waiting when the session ends is not acknowledged: the
next session's Hello carries the level read back from the target, made durable
first.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Protocol

__all__ = ["MAX_POLL_S", "POLL_S", "DurableAcks"]

# Seconds between two looks while levels wait, doubled after each look that found
# nothing new up to MAX_POLL_S (the WAL writer flushes every wal_writer_delay, 200 ms
# by default; the publisher records acks at most every 0.1 s, publisher/acks.py).
POLL_S = 0.01
MAX_POLL_S = 0.1


class _Durable(Protocol):
    def durable_level(self, applied: int, *, poll: bool = False) -> tuple[int, bool]: ...


class _Acks(Protocol):
    def offer_ack(self, level: int) -> None: ...


class DurableAcks:
    """Acknowledges applied levels once the target holds them durably."""

    def __init__(self, applier: object, stream: _Acks, level: int) -> None:
        # An applier without durable_level (a test's) commits durably.
        self._durable: _Durable | None = applier if hasattr(applier, "durable_level") else None
        self._stream = stream
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self.sent = level  # the session's Hello carried it
        self._applied = level
        self._polling = False  # a poller runs, or its start is on its way to the loop
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    def applied(self, level: int) -> None:
        """``level`` is committed on the target: acknowledge what of it is durable.

        On the apply thread; never waits for the loop.
        """
        if self._durable is None:
            with self._lock:
                self._applied = level
            self._send(level)
            return
        durable, waiting = self._durable.durable_level(level)
        with self._lock:
            self._applied = level
            start = waiting and not self._polling
            self._polling = self._polling or start
        self._send(durable)
        if start:
            with contextlib.suppress(RuntimeError):  # the loop closed: the session is over
                self._loop.call_soon_threadsafe(self._start_poller)

    def _start_poller(self) -> None:
        if self._closed:
            return
        self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        source = self._durable
        assert source is not None
        with self._lock:
            seen = self._applied
        pause = POLL_S
        try:
            while True:
                await asyncio.sleep(pause)
                with self._lock:
                    applied = self._applied
                if applied != seen:
                    # A batch committed meanwhile and brought the flushed LSN: no
                    # thread hop, no query (they cost the in-sync apply CPU).
                    seen = applied
                    durable, waiting = source.durable_level(seen)
                else:
                    durable, waiting = await asyncio.to_thread(
                        source.durable_level, seen, poll=True
                    )
                # Twice as long after a look that found nothing new, up to MAX_POLL_S:
                # the WAL writer flushes every wal_writer_delay, and asks between its
                # flushes cost the subscriber and the target's backend CPU for nothing.
                pause = POLL_S if durable > self.sent else min(pause * 2, MAX_POLL_S)
                self._send(durable)
                if not waiting:
                    with self._lock:
                        if self._applied == seen:  # else: one more look (the docstring)
                            self._polling = False
                            return
        finally:
            self._poller = None

    def _send(self, level: int) -> None:
        with self._lock:  # in level order: the stream sends the highest offered
            if level <= self.sent:
                return  # nothing new (most batches of an asynchronous PostgreSQL commit)
            self.sent = level
            self._stream.offer_ack(level)

    async def close(self) -> None:
        """The session ends (the apply thread is done): levels still waiting are not
        acknowledged."""
        self._closed = True
        poller = self._poller
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
