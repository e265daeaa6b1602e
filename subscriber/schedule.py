"""Scheduled subscriptions and the clock they run on.

A subscription with a schedule does not stay connected: at each scheduled time
it connects, syncs until it is in sync, then disconnects until the next time.
Two styles, as in Virtuoso and Oracle:

* calendar (Virtuoso): ``at`` times of day (UTC, "HH:MM"), optionally only on
  some ``weekdays`` ("mon".."sun"), ``days`` of the month and ``months``;
* interval (Oracle's push interval): ``every_s`` seconds after the previous run
  started.

Time comes from a :class:`Clock`, so tests drive schedules with a fake one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "Schedule", "SystemClock"]

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep(self, seconds: float, wake: asyncio.Event) -> None:
        """Sleep ``seconds`` or until ``wake`` is set."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float, wake: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), max(0.0, seconds))


class FakeClock:
    """A clock for tests: a sleep waits until the test calls :meth:`advance`.

    ``advance()`` moves time forward by the pending sleep and releases it, so a
    test sees each scheduled wait, asserts on it, then lets it pass.
    """

    def __init__(self, start: float) -> None:
        self.t = start
        self.sleeps: list[float] = []
        self._gate: asyncio.Event | None = None
        self._pending = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float, wake: asyncio.Event) -> None:
        self.sleeps.append(seconds)
        self._pending = max(0.0, seconds)
        gate = self._gate = asyncio.Event()
        waiters = {asyncio.ensure_future(gate.wait()), asyncio.ensure_future(wake.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    @property
    def sleeping(self) -> bool:
        return self._gate is not None and not self._gate.is_set()

    def advance(self) -> None:
        """Let the pending sleep end, time having moved by its length."""
        assert self._gate is not None, "nothing is sleeping"
        self.t += self._pending
        self._gate.set()


def _parse_time(text: str) -> dt.time:
    try:
        hh, mm = text.split(":")
        return dt.time(int(hh), int(mm), tzinfo=dt.UTC)
    except ValueError:
        raise ValueError(f"at: {text!r} is not HH:MM") from None


@dataclasses.dataclass(frozen=True)
class Schedule:
    every_s: float = 0.0
    at: list[str] = dataclasses.field(default_factory=list)
    weekdays: list[str] = dataclasses.field(default_factory=list)
    days: list[int] = dataclasses.field(default_factory=list)
    months: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        calendar = bool(self.at or self.weekdays or self.days or self.months)
        if self.every_s and calendar:
            raise ValueError("use either every_s or at/weekdays/days/months, not both")
        if self.every_s < 0:
            raise ValueError("every_s must be positive")
        for t in self.at:
            _parse_time(t)
        for w in self.weekdays:
            if w.lower() not in WEEKDAYS:
                raise ValueError(f"weekdays: {w!r} is not one of {', '.join(WEEKDAYS)}")
        for d in self.days:
            if not 1 <= d <= 31:
                raise ValueError(f"days: {d} is not a day of the month (1-31)")
        for m in self.months:
            if not 1 <= m <= 12:
                raise ValueError(f"months: {m} is not a month (1-12)")

    @property
    def enabled(self) -> bool:
        return bool(self.every_s or self.at or self.weekdays or self.days or self.months)

    def next_run(self, now: float, last_start: float | None) -> float:
        """The first scheduled time at or after ``now`` (epoch seconds)."""
        if self.every_s:
            if last_start is None:
                return now
            return max(now, last_start + self.every_s)
        if last_start is not None:
            now = max(now, last_start + 60)  # a calendar run happens once per scheduled minute
        times = sorted(_parse_time(t) for t in self.at) or [dt.time(0, 0, tzinfo=dt.UTC)]
        weekdays = {WEEKDAYS.index(w.lower()) for w in self.weekdays}
        start = dt.datetime.fromtimestamp(now, dt.UTC)
        day = start.date()
        for _ in range(366 * 4 + 1):  # a 29 February falls within four years
            if (
                (not weekdays or day.weekday() in weekdays)
                and (not self.days or day.day in self.days)
                and (not self.months or day.month in self.months)
            ):
                for t in times:
                    candidate = dt.datetime.combine(day, t)
                    if candidate >= start:
                        return candidate.timestamp()
            day += dt.timedelta(days=1)
        raise ValueError("this schedule never matches a date (check days and months)")
