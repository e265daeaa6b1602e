"""Deleting logged capture rows off the capture loop, on a connection of its own.

Capture rows are deleted once every publication's log holds them durably (the
bound: the lowest publication position, ``SqliteSource._release``), at most once a
second or when many wait.  Done in the capture loop, each release stopped it: at
1,000 W1 transactions a second, 2-40 ms once a second (five ``DELETE`` transactions
of :data:`~publisher.capture.sqlite.locks.RELEASE_BATCH` rows, each a commit with
its fsync and a wait for the application's write lock), which showed as the
capture stage's p99 and in the in-sync lag's.

:class:`Releaser` runs the same deletes (``locks.delete_released``) in a thread of
its own with its own connection: the loop hands it the bound
(:meth:`Releaser.request`) and goes on polling; reads and this writer do not block
each other in WAL mode. The connection commits with ``synchronous = NORMAL``: a
delete lost to a power cut brings back rows below every publication's position,
which capture skips (it reads after each publication's position) and the next
release deletes again, so nothing is captured twice. Lock waits count in
``health.lock_waits`` as the loop's own do; a release that fails is logged and tried
again with the next request (the rows stay until then, nothing else depends on their
deletion).
"""

from __future__ import annotations

import sqlite3
import threading
from functools import partial
from pathlib import Path

import structlog

from publisher.capture.health import CaptureHealth
from publisher.capture.sqlite.locks import WAIT_SLICE_S, delete_released, waiting

__all__ = ["Releaser"]

log = structlog.get_logger(__name__)


class Releaser:
    """A thread deleting capture rows up to the last requested id."""

    def __init__(self, path: Path, health: CaptureHealth, *, timeout_s: float = 30.0) -> None:
        self.path = path
        self._waiting = partial(waiting, path=path, health=health, timeout_s=timeout_s)
        self._wanted = 0  # delete rows up to this id
        self._done = 0  # rows up to this id are deleted
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def request(self, upto_id: int) -> None:
        """Delete the rows with ids up to ``upto_id`` (in the background)."""
        with self._wake:
            if upto_id > self._wanted:
                self._wanted = upto_id
                self._wake.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="txrepl-sqlite-release", daemon=True
                )
                self._thread.start()

    def wait(self, timeout_s: float = 30.0) -> bool:
        """Until every requested row is deleted (tests, shutdown); False on timeout."""
        with self._wake:
            return self._wake.wait_for(lambda: self._done >= self._wanted or self._stop, timeout_s)

    def close(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(
            str(self.path), isolation_level=None, check_same_thread=False, timeout=WAIT_SLICE_S
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(WAIT_SLICE_S * 1000)}")
            conn.execute("PRAGMA synchronous = NORMAL")
            while True:
                with self._wake:
                    self._wake.wait_for(lambda: self._stop or self._wanted > self._done)
                    if self._stop:
                        return
                    upto = self._wanted
                try:
                    delete_released(conn, upto, self._waiting)
                except Exception as exc:  # the rows stay; the next request tries again
                    log.warning(
                        "capture rows not released; trying again later",
                        path=str(self.path),
                        error=str(exc),
                    )
                    with self._wake:
                        self._wake.wait(1.0)
                    continue
                with self._wake:
                    self._done = max(self._done, upto)
                    self._wake.notify_all()
        finally:
            conn.close()
