"""Waiting for SQLite's write lock without failing and without holding it long.

Capture must never make the application fail with ``database is locked`` nor
fail itself.  Its own write transactions are short: released capture rows are
deleted RELEASE_BATCH rows per transaction (a large backlog deleted in one
DELETE held the write lock for seconds, past an application's 5 s busy
timeout).  When the application holds the lock, capture waits: SQLite's busy
handler waits up to WAIT_SLICE_S, then :func:`waiting` counts one lock wait
(``health.lock_waits``, exported as ``txrepl_capture_lock_waits_total``) and
tries again, until ``timeout_s`` in all; only then does the poll fail (counted
in ``txrepl_capture_failures`` and retried by the capture loop).  Rejected: one
long busy timeout (the waits were invisible in metrics, and a wait past it
failed the poll with SQLite's bare message).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import structlog

from publisher.capture.health import CaptureHealth
from publisher.errors import SourceError

__all__ = ["RELEASE_BATCH", "WAIT_SLICE_S", "delete_released", "waiting"]

WAIT_SLICE_S = 0.25
RELEASE_BATCH = 500  # 50 MB of 100 KB rows: well under 0.5 s of write lock

log = structlog.get_logger(__name__)
T = TypeVar("T")


def waiting(attempt: Callable[[], T], *, path: Path, health: CaptureHealth, timeout_s: float) -> T:
    """``attempt()``, retried while the source is locked, each wait counted."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if "locked" not in text and "busy" not in text:
                raise
            health.lock_waits += 1
            if time.monotonic() >= deadline:
                raise SourceError(
                    f"SQLite source {path} stayed locked by another connection for more"
                    f" than {timeout_s:g} s: {text}"
                ) from exc
            log.info("source locked by another connection; waiting", path=str(path))


_DELETE = (
    "DELETE FROM _txrepl_capture WHERE id IN (SELECT id FROM _txrepl_capture"
    f" WHERE id <= ? ORDER BY id LIMIT {RELEASE_BATCH})"
)


def delete_released(
    conn: sqlite3.Connection,
    upto_id: int,
    wait: Callable[[Callable[[], sqlite3.Cursor]], sqlite3.Cursor],
) -> None:
    """Delete the capture rows with ids up to ``upto_id``, RELEASE_BATCH rows per
    transaction, each attempt through ``wait`` (a :func:`waiting` bound to the source)."""
    delete = partial(conn.execute, _DELETE, (upto_id,))
    while wait(delete).rowcount > 0:
        pass
