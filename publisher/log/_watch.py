"""Waiting on an event loop for a log's head to reach a seq (issue 23, CPU per entry).

An in-sync feed waits for the head after every entry it sends.  Each wait used to
add a log listener (the log's lock, a new tuple of listeners), make a future, a
task around :meth:`Log.wait_for` and an ``asyncio.wait``, then undo all of it: per
entry, at 1,000 transactions/s.  Now a log has one :class:`HeadWatch` per event
loop, registered as its listener once; a wait is a future in the watch's table.

No lost wake-up.  The appending thread (the group commit's leader) publishes the
new head before it calls the listeners (``Log._sync_round_locked``); a waiter,
on the loop, enters its future and lowers ``_lowest`` before it reads the head
once more.  Both are plain attribute writes and reads under the GIL, so either
the waiter's read sees the new head (its future resolves at once), or the
listener's read of ``_lowest`` sees the waiter (it schedules :meth:`_release`).

At most one :meth:`_release` is scheduled at a time (``_scheduled``): a head that
moves ten times before the loop runs wakes it once.  ``_release`` clears
``_scheduled`` before it reads the head, so a head published after that read
schedules another release; one published before it is covered by the read.
``_lowest`` is written on the loop only: lowered when a waiter enters, otherwise
recomputed from the table, so the listener may read a value lower than needed (an
extra wake-up, harmless), never one above a registered waiter's seq (a lost one).

Only the loop touches the table; the listener only reads ``_lowest`` and
``_scheduled`` and calls ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["HeadWatch"]

_NOBODY = 1 << 64  # above every seq: nobody waits


class HeadWatch:
    """Futures of one event loop that resolve when a log's head reaches their seq."""

    __slots__ = ("_head", "_loop", "_lowest", "_scheduled", "_waiters")

    def __init__(self, head: Callable[[], int], loop: asyncio.AbstractEventLoop) -> None:
        self._head = head
        self._loop = loop
        self._waiters: dict[asyncio.Future[int], int] = {}
        self._lowest = _NOBODY  # the lowest seq waited for
        self._scheduled = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def waiting(self) -> int:
        """How many futures wait (tests check that none is left behind)."""
        return len(self._waiters)

    def future(self, seq: int) -> asyncio.Future[int]:
        """A future (of the loop; call on it) that resolves to the head once the head
        reaches ``seq``.  Pass it to :meth:`discard` when no longer waited for."""
        fut: asyncio.Future[int] = self._loop.create_future()
        head = self._head()
        if head >= seq:
            fut.set_result(head)
            return fut
        self._waiters[fut] = seq
        if seq < self._lowest:
            self._lowest = seq
        head = self._head()  # after _lowest: see the module docstring
        if head >= seq:
            del self._waiters[fut]
            self._lowest = min(self._waiters.values(), default=_NOBODY)
            fut.set_result(head)
        return fut

    def discard(self, fut: asyncio.Future[int]) -> None:
        """Stop waiting with ``fut`` (resolved, timed out or cancelled)."""
        if self._waiters.pop(fut, None) is not None:
            self._lowest = min(self._waiters.values(), default=_NOBODY)

    def on_head(self, head: int) -> None:
        """The log's listener: runs on the appending thread after each new head."""
        if head >= self._lowest and not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._release)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _release(self) -> None:
        self._scheduled = False
        head = self._head()
        waiters = self._waiters
        done = [fut for fut, seq in waiters.items() if seq <= head]
        for fut in done:
            del waiters[fut]
            if not fut.done():
                fut.set_result(head)
        self._lowest = min(waiters.values(), default=_NOBODY)
