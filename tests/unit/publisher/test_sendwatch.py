"""A feed's send timeout with one watcher per feed (publisher/sendwatch.py, issue 23)."""

from __future__ import annotations

import asyncio

import pytest

from publisher.sendwatch import SendWatch


async def test_a_send_blocked_past_the_timeout_ends_false_and_the_task_goes_on() -> None:
    """A write that never completes is given up after the timeout: ``send`` returns
    False, and the feed's task is not left cancelled (it can still await)."""
    watch = SendWatch(0.2)
    watch.start()
    try:
        never = asyncio.get_running_loop().create_future()
        async with asyncio.timeout(30):  # in this task: the one the watch cancels
            assert await watch.send(never) is False
        await asyncio.sleep(0)  # not cancelled: this returns
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    finally:
        watch.stop()


async def test_sends_shorter_than_the_timeout_are_never_cut() -> None:
    """Sends of 0.1 s one after the other for longer than the 2 s timeout all succeed:
    the timeout is per send, not per feed."""
    watch = SendWatch(2.0)
    watch.start()
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        sends = 0
        while loop.time() - began < 2.5:
            assert await watch.send(asyncio.sleep(0.1)) is True
            sends += 1
        assert sends >= 2
    finally:
        watch.stop()


async def test_a_cancel_from_elsewhere_during_a_send_stays_a_cancel() -> None:
    """When the feed's task is cancelled during a send (the subscriber went away), the
    send raises CancelledError rather than report a timeout."""
    watch = SendWatch(30.0)
    blocked = asyncio.Event()

    async def feed() -> bool:
        watch.start()
        try:
            blocked.set()
            return await watch.send(asyncio.get_running_loop().create_future())
        finally:
            watch.stop()

    task = asyncio.create_task(feed())
    await asyncio.wait_for(blocked.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert watch.expired is False
