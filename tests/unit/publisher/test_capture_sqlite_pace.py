"""The busy pace of SQLite capture (publisher/capture/sqlite/wake.py): while commits
keep coming, a check is due one step after the last check *began*, so the time a check
takes (read, build, the log's fsync) is not added to the wait of the commits after it."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from publisher.capture.sqlite import wake
from publisher.capture.sqlite.wake import Pace, Watch

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="inotify: elsewhere capture polls"
)

STEP_S = 0.5  # a long step, so that the margins below hold on a loaded machine


def _busy_wait_after_a_check_of(seconds: float, tmp_path: Path) -> float:
    (tmp_path / "src.db").touch()
    watch = Watch(tmp_path / "src.db")
    assert watch.active
    pace = Pace(watch, poll_s=5.0)
    halt = threading.Event()
    try:
        assert pace.wait(halt, busy=False)  # the first check is due at once
        time.sleep(seconds)  # the check's own work
        t0 = time.monotonic()
        assert pace.wait(halt, busy=True)
        return time.monotonic() - t0
    finally:
        watch.close()


def test_a_check_longer_than_the_step_is_followed_by_the_next_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wake, "BUSY_STEP_S", STEP_S)
    assert _busy_wait_after_a_check_of(STEP_S * 1.2, tmp_path) < STEP_S / 2


def test_a_short_check_waits_out_the_rest_of_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wake, "BUSY_STEP_S", STEP_S)
    waited = _busy_wait_after_a_check_of(STEP_S * 0.2, tmp_path)
    assert waited > STEP_S * 0.5  # still paced: commits keep being grouped
