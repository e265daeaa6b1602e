"""What capture appends, makes durable and confirms to the source, and when.

Part of :class:`~publisher.capture.postgres._session.Session`.

Transactions read back to back (a backlog) are appended together: each commit's
entry waits in ``queued`` (at most ``_QUEUE_MAX``) and :meth:`Confirming._drain`
appends them, each publication's in one call, when a read finds nothing more, and
before anything else touches the logs or the slot: a fragment (``_room``), a crossing
or a mark (a Begin with one pending), a schema saved or a copy asked (``_commit``),
a reload (positions read), a confirmation (``_feedback`` drains, then flushes, then
confirms).  So the logs keep commit order (every other capture append follows a
drain), and no queued entry is confirmed to the source before it is durable: kill -9
loses the queue, which is in no log and not confirmed, and the restart reads it
again.  A ``Publish`` append between carries the position of the last entry
appended, below the queued ones': positions never decrease along a log.  One entry
per transaction as before (transaction boundaries and commit times stay exact).

Durability is the flusher's (``publisher/capture/logs.py``), kicked after each
drain; the slot is confirmed (``_feedback``, at most every ``feedback_interval_s``)
only after every log the confirmed transactions touched is flushed.
"""

from __future__ import annotations

import time
from typing import Any

from publisher.capture.logs import Flusher
from publisher.capture.postgres._crossing import SnapshotCrossing
from publisher.capture.postgres._ddlwatch import DdlWatch
from publisher.capture.postgres._state import Txn
from publisher.publication import Encoded, Publication, append_in_order

__all__ = ["Confirming"]


class Confirming(SnapshotCrossing):
    """``_drain``, ``_idle`` and ``_feedback`` of :class:`Session`."""

    txn: Txn | None
    cur: Any
    watch: DdlWatch | None
    watched: dict[str, str]
    queued: list[tuple[Publication, Encoded]]
    flusher: Flusher
    confirmable: int
    confirmed: int
    hold: int | None
    last_feedback: float

    def _keepalive(self) -> None:
        if self.cur is not None:
            self.cur.send_feedback()

    def _idle(self) -> None:
        if self.txn is not None:
            return
        if self.watch is not None:
            self.watch.poll(self.watched)
        wal_end = int(self.cur.wal_end or 0)
        first = self.cap._first_mark()
        if self.pending is not None or first is not None:
            wanted = min(
                x for x in (first, self.pending.lsn if self.pending else None) if x is not None
            )
            if wal_end >= wanted:
                self._cross(wal_end)
            elif time.monotonic() - self.last_feedback > self.cap.feedback_interval_s:
                # ask for a keepalive: it carries how far the server has decoded
                self.cur.send_feedback(reply=True)
                self.last_feedback = time.monotonic()
        # Every transaction ending before the keepalive's position has been handled.
        self.confirmable = max(self.confirmable, wal_end)
        self._feedback()

    def _drain(self) -> None:
        """Append the queued entries (each publication's in one call) and kick the
        flusher.  Until then nothing of them is in a log, and the slot is not confirmed
        past them (_feedback drains first): a crash re-reads them from the slot."""
        queued = self.queued
        if not queued:
            return
        self.queued = []
        append_in_order(queued)
        self.cap.entries += len(queued)
        self.flusher.kick()

    def _feedback(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.confirmable <= self.confirmed:
            return
        if not force and now - self.last_feedback < self.cap.feedback_interval_s:
            return
        self._drain()
        for name in self.touched:
            self.state[name].pub.log.flush()  # durable before the slot moves past it
        self.touched.clear()
        lsn = self.confirmable if self.hold is None else min(self.confirmable, self.hold)
        if lsn <= self.confirmed:
            return
        self.cur.send_feedback(flush_lsn=lsn, write_lsn=lsn)
        self.confirmed = lsn
        self.last_feedback = now
