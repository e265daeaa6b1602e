"""CaptureHealth: whether a source's capture works, as its loop reports it.

The capture thread writes (``failed`` after each failed attempt, ``ok`` after
each good one); the event loop and the metrics thread read.  Plain attribute
writes of ints, floats and strings, read without a lock: a reader sees either
the value before or after an update, and a health answer half a poll old is
fine.

The state machine, per source (both sources capture every publication in one
loop, so a failure concerns each publication of the source alike):

    serving ──FAILING_AFTER failures in a row──▶ failing ──ok──▶ serving

A publication can also stop alone: its capture refused a row larger than
``max_entry_bytes`` (the source's ``refused`` map, which health reads): that
publication is not serving while the others go on (``serving_for``).

One failure is not enough: a source briefly locked by a writer (SQLite) or a
reconnect after a PostgreSQL restart is retried and passes; health would flap.
Three in a row take 1.4 s (SQLite) to 2.8 s (PostgreSQL) of the sources'
backoffs, and mean capture is stuck, not busy.  The first good poll (SQLite) or
the first stream started (PostgreSQL) turns it back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import structlog

from common.backoff import Backoff

__all__ = ["FAILING_AFTER", "CaptureHealth", "keep_streaming"]

log = structlog.get_logger(__name__)

FAILING_AFTER = 3


class CaptureHealth:
    """Counts of a source's capture failures; ``serving`` per the module docstring."""

    def __init__(self, refused: Mapping[str, BaseException] | None = None) -> None:
        self.refused: Mapping[str, BaseException] = {} if refused is None else refused
        self.failures = 0  # all failed attempts since start (a counter)
        self.in_a_row = 0  # failed attempts since the last good one
        self.lock_waits = 0  # times the source was locked by another writer (SQLite)
        self.last_error = ""  # of the latest failure, kept while failing
        self.last_ok = time.time()  # unix seconds of the latest good attempt

    def failed(self, error: BaseException | str) -> None:
        text = str(error).strip()
        self.last_error = text.splitlines()[0][:500] if text else repr(error)
        self.failures += 1
        self.in_a_row += 1

    def ok(self) -> None:
        if self.in_a_row:
            self.in_a_row = 0
            self.last_error = ""
        self.last_ok = time.time()

    @property
    def serving(self) -> bool:
        return self.in_a_row < FAILING_AFTER

    def serving_for(self, publication: str) -> bool:
        return self.serving and publication not in self.refused

    def error_for(self, publication: str) -> str:
        """Why ``publication``'s capture does not serve ("" while it does)."""
        refused = self.refused.get(publication)
        if refused is not None:
            return str(refused).splitlines()[0][:500]
        return "" if self.serving else self.last_error


def keep_streaming(
    run: Callable[[], None],
    health: CaptureHealth,
    halt: threading.Event,
    *,
    what: str,
    retry: Backoff,
) -> None:
    """``run()`` until ``halt``; after each failure, recorded in ``health``, again after
    ``retry``'s delay (the source restarts, the network blips: capture keeps trying)."""
    failures = 0
    while not halt.is_set():
        try:
            run()
            failures = 0
        except Exception as e:
            failures += 1
            health.failed(e)
            log.error(f"{what} failed; retrying", error=str(e), failures=failures)
            halt.wait(retry.delay(failures))
