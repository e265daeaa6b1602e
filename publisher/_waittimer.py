"""The time limit of a feed's waits for the head, with one timer per feed (issue 23).

An in-sync feed waits for the head after every message it sends, for at most
``heartbeat_s`` (then it sends a Heartbeat).  Each wait used to arm a timer of its
own (``loop.call_later``: a handle pushed on the loop's heap) and cancel it when the
head came first, as it nearly always does: per entry, at 1,000 transactions/s, a
handle made, pushed and cancelled, and a cancelled handle left on the heap until the
loop sweeps them.  Now a feed's :class:`WaitTimer` keeps at most one handle:

    arm(fut, deadline):  this wait's future and the loop time it ends at; the handle
                         is kept if due at or before the deadline, else replaced
    disarm():            the wait ended; the handle stays for the next wait
    the handle fires:    no wait (or its future is done) ─▶ nothing; the next arm
                         makes a handle
                         the wait's deadline reached ─▶ settle its future
                         the deadline ahead ─▶ a handle at the deadline

So a wait still ends when the head reaches its seq, or at its deadline (give or take
the loop's turn, as a timer of its own would), never later: the handle is never due
after the deadline of the wait armed.  A busy feed's handle fires about once per
``heartbeat_s``, finds the deadline of a later wait ahead, and is moved there.  A
handle fires a little before its time at most by the loop's clock resolution
(``BaseEventLoop._run_once``), so a deadline within ``_EARLY`` of now counts as
reached rather than arming a handle for a microsecond.

Only the feed's event loop calls it.
"""

from __future__ import annotations

import asyncio

__all__ = ["WaitTimer"]

_EARLY = 0.001  # s: a deadline this close counts as reached (see the docstring)


class WaitTimer:
    """Ends a feed's waits at their deadlines; one ``loop.call_at`` handle at a time."""

    __slots__ = ("_deadline", "_fut", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fut: asyncio.Future[int] | None = None
        self._deadline = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, fut: asyncio.Future[int], wait_s: float) -> None:
        """Settle ``fut`` (with 0) once ``wait_s`` seconds have passed, unless it is done
        or :meth:`disarm` was called before."""
        deadline = self._loop.time() + wait_s
        self._fut, self._deadline = fut, deadline
        handle = self._handle
        if handle is not None:
            if handle.when() <= deadline:
                return
            handle.cancel()
        self._handle = self._loop.call_at(deadline, self._fire)

    def disarm(self) -> None:
        self._fut = None

    def cancel(self) -> None:
        """The feed ended: drop the handle."""
        self._fut = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        fut = self._fut
        if fut is None or fut.done():
            return
        if self._loop.time() + _EARLY >= self._deadline:
            self._fut = None
            fut.set_result(0)
        else:
            self._handle = self._loop.call_at(self._deadline, self._fire)
