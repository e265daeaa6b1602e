"""When a big batch's demand starts the subscriber's JVM (``[spark] start = "on_demand"``,
subscriber/apply/lazy.py): only once big batches have kept coming for
``start_after_s``, each within that long of the one before.  A real LazySpark on a
clock the test moves; its start returns an object standing for the session."""

from __future__ import annotations

import threading

import pytest

from subscriber.apply.lazy import LazySpark, spark_ready
from subscriber.config import SparkConfig


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lazy(start_after_s: float) -> tuple[LazySpark, _Clock, threading.Event]:
    clock, started = _Clock(), threading.Event()

    def start() -> object:
        started.set()
        return object()

    lazy = LazySpark(start, at_once=False, start_after_s=start_after_s, clock=clock)  # type: ignore[arg-type]
    return lazy, clock, started


def _begun(lazy: LazySpark) -> bool:
    return not lazy.idle


def _asked_at(lazy: LazySpark, clock: _Clock, *times: float) -> None:
    for t in times:
        clock.now = 1000.0 + t
        assert spark_ready(lazy) is False  # never ready before it started: the driver plans


def test_a_short_catch_up_never_starts_the_jvm() -> None:
    lazy, clock, started = _lazy(5.0)
    _asked_at(lazy, clock, 0, 0.4, 1.1, 2.0, 3.3, 4.9)
    assert not _begun(lazy)
    assert not started.is_set()


def test_a_demand_lasting_start_after_s_starts_it() -> None:
    lazy, clock, started = _lazy(5.0)
    _asked_at(lazy, clock, 0, 2.5, 4.9)
    assert not _begun(lazy)
    _asked_at(lazy, clock, 5.0)
    assert _begun(lazy)
    assert started.wait(30)


def test_a_gap_as_long_as_start_after_s_ends_the_demand() -> None:
    lazy, clock, started = _lazy(5.0)
    _asked_at(lazy, clock, 0, 3.0)  # a demand of 3 s, then quiet
    _asked_at(lazy, clock, 8.5, 12.0)  # 5.5 s later: a new demand, 3.5 s old
    assert not _begun(lazy)
    _asked_at(lazy, clock, 13.4)  # still within 5 s of its start
    assert not _begun(lazy)
    _asked_at(lazy, clock, 13.5)
    assert _begun(lazy)
    assert started.wait(30)


def test_zero_starts_it_at_the_first_big_batch() -> None:
    lazy, clock, started = _lazy(0.0)
    _asked_at(lazy, clock, 0)
    assert _begun(lazy)
    assert started.wait(30)


def test_a_use_starts_it_at_once_whatever_the_demand() -> None:
    lazy, _clock, started = _lazy(5.0)
    assert lazy.session() is not None  # a snapshot load, a transform: waits for it
    assert started.is_set()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_start_after_s_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match=r"spark\.start_after_s .*seconds >= 0"):
        SparkConfig(start_after_s=bad)
