"""The capture thread: moves committed source rows into the publication logs.

One step reads every capture row committed so far (optionally only up to a
given capture id, for snapshots) and appends at most one entry per publication,
then releases the rows every publication has durably logged.  Steps run under
``lock`` so a snapshot can stop capture at an exact position (publisher/snapshot.py).
"""

from __future__ import annotations

import threading
import time

import structlog

from publisher.capture.postgres import PostgresCapture
from publisher.capture.sqlite import SqliteCapture
from publisher.publication import Publication

__all__ = ["CaptureThread", "PostgresCaptureThread"]

log = structlog.get_logger(__name__)

RELEASE_EVERY_S = 1.0
RELEASE_ROWS = 50_000


class PostgresCaptureThread(threading.Thread):
    """Runs log-based PostgreSQL capture, restarting it after transient failures."""

    def __init__(self, capture: PostgresCapture, pubs: list[Publication]) -> None:
        super().__init__(name="txrepl-pg-capture", daemon=True)
        self.capture = capture
        self.pubs = pubs
        self.halt = threading.Event()
        self.lock = threading.Lock()

    @property
    def entries(self) -> int:
        return self.capture.entries

    def run(self) -> None:
        failures = 0
        while not self.halt.is_set():
            try:
                self.capture.run(self.pubs, self.halt)
                failures = 0
            except Exception as e:  # the source restarts, the network blips: keep trying
                failures += 1
                log.error("PostgreSQL capture failed; retrying", error=str(e), failures=failures)
                self.halt.wait(min(10.0, 0.2 * 2**failures))


class CaptureThread(threading.Thread):
    def __init__(
        self, capture: SqliteCapture, pubs: list[Publication], poll_interval_s: float
    ) -> None:
        super().__init__(name="txrepl-capture", daemon=True)
        self.capture = capture
        self.pubs = pubs
        self.poll_interval_s = poll_interval_s
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.entries = 0
        self._unreleased = 0
        self._released_at = time.monotonic()

    def run(self) -> None:
        failures = 0
        force = True
        while not self.halt.is_set():
            try:
                if self.capture.changed() or force:
                    force = False
                    with self.lock:
                        self.step()
                elif self._unreleased:
                    with self.lock:
                        self._release()
                failures = 0
            except Exception as e:  # keep capturing; the source may be busy or briefly locked
                failures += 1
                force = True
                log.error("capture failed; retrying", error=str(e), failures=failures)
                self.halt.wait(min(5.0, 0.1 * 2**failures))
                continue
            self.halt.wait(self.poll_interval_s)

    def step(self, upto: int | None = None) -> int:
        """One poll: committed capture rows (ids <= ``upto``) become at most one entry each."""
        low = min(p.position for p in self.pubs)
        rows = self.capture.read(low, upto)
        if not rows:
            return 0
        installed = self.capture.installed()
        appended = 0
        for pub in self.pubs:
            entry, last = self.capture.build_entry(
                pub.name, rows, pub.position, installed.get(pub.name, {})
            )
            if entry is not None:
                pub.append(entry, position=last)
                appended += 1
            elif last > pub.position:
                pub.advance(last)
        self.entries += appended
        # Deleting captured rows takes SQLite's write lock, which the application's
        # writers hold almost all the time under load: doing it every poll made
        # capture queue behind them (and grouped hundreds of transactions per entry).
        # Release at most once a second, or when many rows wait.
        self._unreleased += len(rows)
        self._release()
        return appended

    def _release(self) -> None:
        """Delete logged capture rows if a second has passed or many wait."""
        now = time.monotonic()
        if self._unreleased >= RELEASE_ROWS or now - self._released_at >= RELEASE_EVERY_S:
            self.capture.release(min(p.position for p in self.pubs))
            self._unreleased = 0
            self._released_at = now
