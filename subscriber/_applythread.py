"""A session's apply thread: one long-lived thread rather than a pool hop per batch.

``asyncio.to_thread`` per batch copies the context, takes the executor's locks,
chains a ``concurrent.futures.Future`` to an asyncio one and wraps the coroutine
in a task: about 60 µs of CPU per round trip here, against about 29 µs for this
thread (a ``SimpleQueue`` put, one ``call_soon_threadsafe`` back; a no-op job,
20,000 round trips, docs/performance.md).  In sync that is per applied batch.

Order: jobs run one at a time, in the order submitted, on the one thread.  A job
cannot be stopped once started (as with ``to_thread``): cancelling its future only
drops the result.  :meth:`ApplyThread.close` lets the job in hand finish, then
the thread ends; the thread is not a daemon, so the interpreter's exit waits for
a target transaction in flight, as it waits for the default executor's threads.
A result that arrives after the event loop closed is dropped: what the job
committed is in the target with its level, which the next session reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ApplyThread"]

T = TypeVar("T")

_Job = tuple[asyncio.Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class ApplyThread:
    """Runs blocking calls for one event loop, one at a time, on one thread."""

    def __init__(self, name: str = "apply") -> None:
        self._loop = asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name)
        self._thread.start()
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
        """``fn(*args, **kwargs)`` on the thread; its result (or exception) as a future."""
        if self._closed:
            raise RuntimeError("the apply thread is closed")
        fut: asyncio.Future[T] = self._loop.create_future()
        self._jobs.put((fut, fn, args, kwargs))
        return fut

    def close(self) -> None:
        """End the thread once the job in hand (and any queued) is done; idempotent."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)

    def _run(self) -> None:
        jobs, loop = self._jobs, self._loop
        while (job := jobs.get()) is not None:
            fut, fn, args, kwargs = job
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # handed to the awaiting task, as to_thread does
                outcome: tuple[Any, BaseException | None] = (None, e)
            else:
                outcome = (result, None)
            del job, fn, args, kwargs  # the batch's entries are not kept until the next job
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_settle, fut, *outcome)
            del fut, outcome


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():  # cancelled by its awaiting task: the result is dropped
        return
    if error is None:
        fut.set_result(result)
    else:
        fut.set_exception(error)
