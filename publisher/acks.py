"""A feed's acknowledged level, written to the registry behind the acks (issue 23).

An in-sync subscriber acknowledges every batch it applies: at 1,000 transactions/s
that is a few hundred acks a second, and one registry write each (a thread hop and
an SQLAlchemy UPDATE, committed) was a fifth of the publisher's CPU in the W1 lag
benchmark.  The feed keeps the acked level in memory for everything the stream
decides (``Feed.acked``: the queue threshold, impossible acks); the registry's copy
is for retention, ``ListSubscribers``, the metrics and the next start.

So :class:`AckRecorder` writes the latest level when one arrives, then at most once
per ``interval_s`` while acks keep coming (levels in between are never written: only
the latest matters), one write at a time, in order, and the last level when the
feed ends (:meth:`close`, before the feed's ``disconnected`` state).  Why that keeps
every guarantee: the registry's level only lags the subscriber's, by at most
``interval_s`` plus one write, and never goes past what was acknowledged; retention
purges only below the registry's levels, so a lagging level keeps more, never less;
a subscriber starts from the level of its own target (its Hello), never from the
registry's.  A publisher killed meanwhile loses at most the last ``interval_s`` of
levels: the subscriber's next Hello sets them again.

Rejected: a write per ack (the CPU above); only on the feed's end (retention and
``ListSubscribers`` would see a long-running feed's level never move).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

import structlog

__all__ = ["ACK_WRITE_INTERVAL_S", "AckRecorder"]

log = structlog.get_logger(__name__)

ACK_WRITE_INTERVAL_S = 0.1


class _Registry(Protocol):
    def ack(self, publication: str, subscriber: str, level: int) -> None: ...


class AckRecorder:
    """Writes one feed's acknowledged level to the registry (see the module docstring)."""

    def __init__(
        self,
        registry: _Registry,
        publication: str,
        subscriber: str,
        level: int,
        *,
        interval_s: float = ACK_WRITE_INTERVAL_S,
    ) -> None:
        self.registry = registry
        self.publication = publication
        self.subscriber = subscriber
        self.interval_s = interval_s
        self.written = level  # the level the registry holds (set at the Hello)
        self._latest = level
        self._arrived = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def ack(self, level: int) -> None:
        """An acknowledged level (levels of one feed only go up)."""
        self._latest = max(self._latest, level)
        self._arrived.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"acks {self.subscriber}")

    async def _run(self) -> None:
        while not self._closing.is_set():
            await self._arrived.wait()
            self._arrived.clear()
            try:
                await self._write()
            except Exception as e:  # the registry's trouble: tried again at the next ack
                log.warning(
                    "acknowledged level not recorded",
                    publication=self.publication,
                    subscriber=self.subscriber,
                    error=str(e),
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.interval_s)

    async def _write(self) -> None:
        level = self._latest
        if level > self.written:
            await asyncio.to_thread(self.registry.ack, self.publication, self.subscriber, level)
            self.written = level

    async def close(self) -> None:
        """Stop, after writing the last level acknowledged.

        Not by cancelling the writer: a write begun in its thread would go on and
        could land after the last one, with an older level.
        """
        self._closing.set()
        self._arrived.set()
        task, self._task = self._task, None
        if task is not None:
            await task
        await self._write()
