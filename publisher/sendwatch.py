"""The send timeout of a feed, with one timer per feed rather than one per send.

A feed is cut when one send blocks longer than ``send_timeout_s`` (docs/feeds.md).
Each send used to run under ``asyncio.timeout``: a timer made, pushed on the
loop's heap and cancelled per message, one message per entry in sync (issue 23,
the publisher's CPU per entry).  Now a send only notes when it began
(``since``), and one watcher task per feed checks it:

    watcher: sleep until since + timeout (or timeout when no send runs);
             if the send that began at ``since`` still runs past since + timeout:
                 expired = True; cancel the feed's task
    send:    since = now; await the write; since = None
             CancelledError with ``expired``, and no other cancel pending
             (Task.uncancel() == 0): the send timed out, return False

So a feed is cut between ``send_timeout_s`` and ``send_timeout_s`` plus a loop
turn after its send began, as before; a feed that sends nothing wakes its watcher
once per ``send_timeout_s``.  The cancel reaches the feed's task inside the write
(the watcher runs only while the feed's task is suspended there: ``since`` is set
and cleared in the same step as the write's await); a write that completed in the
same loop turn still counts as timed out, and the cut is harmless (the subscriber
resumes from its level).  A cancel from elsewhere (the subscriber went away)
stays a cancel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

__all__ = ["SendWatch"]


class SendWatch:
    """Times the sends of the task that calls :meth:`start` (a feed's)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.since: float | None = None  # loop time the running send began
        self.expired = False
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Watch the sends of the current task from now on."""
        self._task = asyncio.current_task()
        self._watcher = asyncio.create_task(self._watch(), name="send watch")

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def send(self, write: Awaitable[Any]) -> bool:
        """Await ``write``; False when it blocked longer than the timeout."""
        self.since = asyncio.get_running_loop().time()
        try:
            await write
        except asyncio.CancelledError:
            task = self._task
            if self.expired and task is not None and task.uncancel() == 0:
                return False
            raise
        finally:
            self.since = None
        return True

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.timeout_s
        while True:
            since = self.since
            delay = timeout if since is None else since + timeout - loop.time()
            if delay <= 0:
                self.expired = True
                if self._task is not None:
                    self._task.cancel()
                return
            await asyncio.sleep(delay)
