"""A feed's one timer for its waits for the head (publisher/_waittimer.py), on a real
event loop: each wait ends at its own deadline, whatever the handle armed before."""

from __future__ import annotations

import asyncio

from publisher._waittimer import WaitTimer


async def test_a_wait_ends_at_its_deadline() -> None:
    """A wait nothing else ends is settled (with 0) by the timer."""
    timer = WaitTimer(asyncio.get_running_loop())
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    timer.arm(fut, 0.01)
    assert await asyncio.wait_for(fut, 60) == 0


async def test_a_shorter_wait_after_a_long_one_ends_at_its_own_deadline() -> None:
    """A handle due later than the new wait's deadline is replaced: the short wait does
    not inherit the long one's ten minutes."""
    loop = asyncio.get_running_loop()
    timer = WaitTimer(loop)
    long: asyncio.Future[int] = loop.create_future()
    timer.arm(long, 600)
    long.set_result(7)  # the head came first
    timer.disarm()
    short: asyncio.Future[int] = loop.create_future()
    timer.arm(short, 0.01)
    assert await asyncio.wait_for(short, 60) == 0
    timer.cancel()


async def test_a_longer_wait_after_a_short_one_is_not_ended_by_the_earlier_handle() -> None:
    """The handle kept from a short wait fires before a later, longer wait's deadline:
    it moves to that deadline, settles only that wait, and never the ended one."""
    loop = asyncio.get_running_loop()
    timer = WaitTimer(loop)
    first: asyncio.Future[int] = loop.create_future()
    timer.arm(first, 0.01)
    timer.disarm()  # ended by the head (the future is left pending: nobody awaits it)
    second: asyncio.Future[int] = loop.create_future()
    began = loop.time()
    timer.arm(second, 0.2)
    assert await asyncio.wait_for(second, 60) == 0
    assert loop.time() - began >= 0.2 - 0.001  # not at the first handle's 0.01
    assert not first.done()


async def test_a_cancelled_timer_settles_nothing() -> None:
    """After :meth:`cancel` (the feed ended) the armed wait is left alone."""
    loop = asyncio.get_running_loop()
    timer = WaitTimer(loop)
    fut: asyncio.Future[int] = loop.create_future()
    timer.arm(fut, 0.01)
    timer.cancel()
    later: asyncio.Future[int] = loop.create_future()
    loop.call_later(0.05, later.set_result, 1)
    await asyncio.wait_for(later, 60)
    assert not fut.done()
