"""Acks of durable levels only: what the publisher is told the target holds.

An ack lets the publisher's retention drop the entries up to its level, so a level
is acknowledged only once the target holds it durably.  Most targets commit
durably (the level is acknowledged after each batch, as before); a PostgreSQL
target committing asynchronously (subscriber/targets/postgres/_durable.py) holds a
level durably once its WAL is flushed past the batch's commit, some milliseconds
to ``wal_writer_delay`` later.

:meth:`DurableAcks.applied` (after each batch, on the event loop) acknowledges
what the writer already knows durable (the flushed LSN each batch brings back: no
wait, no query) and, while levels wait, a task looks again after ``POLL_S``
(doubling up to ``MAX_POLL_S`` while nothing new is durable): at what the batches
of that time brought, or, when none came, asks the writer in a thread
(:meth:`Applier.durable_level` with ``poll``: a query only when the writer is
idle).  The apply never waits for an ack.  Acks go out in level order, one write
at a time.  A level still waiting when the session ends is not acknowledged: the
next session's Hello carries the level read back from the target, made durable
first.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    async def ack(self, level: int) -> None: ...


class DurableAcks:
    """Acknowledges applied levels once the target holds them durably."""

    def __init__(self, applier: object, stream: _Acks, level: int) -> None:
        # An applier without durable_level (a test's) commits durably.
        self._durable: _Durable | None = applier if hasattr(applier, "durable_level") else None
        self._stream = stream
        self.sent = level  # the session's Hello carried it
        self._applied = level
        self._poller: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()

    async def applied(self, level: int) -> None:
        """``level`` is committed on the target: acknowledge what of it is durable."""
        self._applied = level
        if self._durable is None:
            await self._send(level)
            return
        durable, waiting = self._durable.durable_level(level)
        await self._send(durable)
        if waiting and self._poller is None:
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        source = self._durable
        assert source is not None
        seen = self._applied
        pause = POLL_S
        try:
            while True:
                await asyncio.sleep(pause)
                if self._applied != seen:
                    # A batch committed meanwhile and brought the flushed LSN: no
                    # thread hop, no query (they cost the in-sync apply CPU).
                    seen = self._applied
                    durable, waiting = source.durable_level(seen)
                else:
                    durable, waiting = await asyncio.to_thread(
                        source.durable_level, seen, poll=True
                    )
                # Twice as long after a look that found nothing new, up to MAX_POLL_S:
                # the WAL writer flushes every wal_writer_delay, and asks between its
                # flushes cost the subscriber and the target's backend CPU for nothing.
                pause = POLL_S if durable > self.sent else min(pause * 2, MAX_POLL_S)
                await self._send(durable)
                if not waiting:
                    return
        finally:
            self._poller = None

    async def _send(self, level: int) -> None:
        if level <= self.sent:
            return  # nothing new (most batches of an asynchronous PostgreSQL commit)
        async with self._writing:  # one write at a time on the stream, in level order
            if level > self.sent:
                self.sent = level
                await self._stream.ack(level)

    async def close(self) -> None:
        """The session ends: levels still waiting are not acknowledged."""
        poller = self._poller
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
