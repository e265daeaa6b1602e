"""Schedules: calendar and interval styles compute the next run exactly."""

from __future__ import annotations

import datetime as dt

import pytest

from subscriber.schedule import Schedule


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> float:
    return dt.datetime(year, month, day, hour, minute, tzinfo=dt.UTC).timestamp()


def test_times_of_day_on_weekdays() -> None:
    s = Schedule(at=["02:00", "14:30"], weekdays=["mon", "wed"])
    # Sunday 2026-11-22 10:00 -> Monday 02:00
    assert s.next_run(ts(2026, 11, 22, 10, 0), None) == ts(2026, 11, 23, 2, 0)
    # Monday 03:00 -> Monday 14:30
    assert s.next_run(ts(2026, 11, 23, 3, 0), None) == ts(2026, 11, 23, 14, 30)
    # Monday 14:30 exactly is due now
    assert s.next_run(ts(2026, 11, 23, 14, 30), None) == ts(2026, 11, 23, 14, 30)
    # Monday 15:00 -> Wednesday 02:00
    assert s.next_run(ts(2026, 11, 23, 15, 0), None) == ts(2026, 11, 25, 2, 0)


def test_days_and_months() -> None:
    s = Schedule(days=[29], months=[2])
    assert s.next_run(ts(2026, 11, 22), None) == ts(2028, 2, 29)


def test_interval_counts_from_the_previous_start() -> None:
    s = Schedule(every_s=600)
    assert s.next_run(1000.0, None) == 1000.0
    assert s.next_run(1300.0, 1000.0) == 1600.0
    assert s.next_run(2000.0, 1000.0) == 2000.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_s": 60, "at": ["01:00"]}, "either every_s"),
        ({"at": ["25"]}, "not HH:MM"),
        ({"weekdays": ["funday"]}, "'funday' is not one of"),
        ({"days": [32]}, "32 is not a day"),
        ({"months": [13]}, "13 is not a month"),
    ],
)
def test_bad_schedules_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Schedule(**kwargs)


def test_impossible_schedule_says_so() -> None:
    with pytest.raises(ValueError, match="never matches"):
        Schedule(days=[31], months=[2]).next_run(ts(2026, 1, 1), None)


def test_calendar_run_is_not_repeated_within_its_minute() -> None:
    s = Schedule(at=["02:00"])
    start = ts(2026, 11, 23, 2, 0)
    assert s.next_run(start, start) == ts(2026, 11, 24, 2, 0)
