"""Waiting for a condition inside a test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["until"]


async def until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Return once ``check()`` holds; AssertionError naming ``what`` after ``timeout``.

    A plain loop of short sleeps, no task (tests/integration/subscriber/
    test_feed_stream.py counts the tasks a session makes).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        await asyncio.sleep(0.002)
