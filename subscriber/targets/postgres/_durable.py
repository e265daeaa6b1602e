"""Which applied level the target holds durably: acks follow its flushed WAL (issue 23).

A batch of rows commits with ``synchronous_commit = off`` (``[apply]
synchronous_commit``, the default for PostgreSQL, as PostgreSQL's own apply worker
runs): COMMIT returns once the commit record is in the WAL buffers, before its
fsync.  The rows and the level row are visible at once, but a crash of the target's
server (kill -9, power) can lose the last such commits, all of them from some point
on, never one in the middle.  The publisher drops from its log what a subscriber
acknowledged, so an ack of such a level could lose data.  Hence:

**The commit's LSN.**  In the batch's pipeline, right after COMMIT and outside the
transaction, one statement reads ``pg_current_wal_insert_lsn()`` (and
``pg_current_wal_flush_lsn()``, below).  The server runs a connection's statements
in the order sent, and writes the commit record into the WAL *during* COMMIT, before
COMMIT's reply; so the insert position read by the next statement is at or past the
end of the commit record.  (Read *before* COMMIT it would be short of it.)  The
read is >= the exact end; using it is conservative: the ack may wait for a little
more WAL, never less.  The non-pipelined path (schema, COPY, held groups) reads the
same after its COMMIT, one more round trip per such batch.

**Flushed means durable, and cumulative.**  ``pg_current_wal_flush_lsn() >= L``
means every WAL byte before ``L`` is on disk, hence every commit record inserted
before it.  A batch's level row is updated under the row's lock, after the batch
before it committed (its commit record is earlier in the WAL), so once a batch's
LSN is flushed, its level and every level below it survive a crash.  The durable
level is the last batch (of this connection) whose LSN <= the flushed LSN.

**Where the flushed LSN comes from.**  Each batch's statement above brings it back
for free (the previous batches are usually flushed by then: the WAL writer flushes
at most ``wal_writer_delay`` after an asynchronous commit, 200 ms by default).
While levels wait and no batch comes, the subscriber asks (:meth:`PostgresWriter.
poll_durable`, at most every :data:`POLL_S`, only when the writer is idle: never
in the apply's way).

**After a new connection, LSNs are not compared.**  A server that crashed comes
back with its WAL ending at its last flushed record, so the insert positions it
hands out next may be *below* the LSNs remembered of the lost commits.  A new
connection therefore drops the levels waiting (:meth:`Durable.reset`); the levels
confirmed before stay confirmed (flushed WAL survives).  What the target still
holds is read back from it (``load_state``) in a transaction that takes a
transaction id and commits with ``synchronous_commit = local``: its commit flushes
the WAL up to its own record, which is after every commit its snapshot saw, so the
level it read is durable before anyone is told of it (the Hello of the next
session carries it).  A level applied in memory and lost by the target is then
refused by the next batch's level check (a :class:`GapError`), and the
subscription resumes from the level read back (subscriber/subscription.py).

Not covered: a failover to another server at the same address (its flushed WAL is
not this one's); use ``synchronous_commit = "on"`` and a synchronous standby there.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import psycopg

from common import trace as _trace

__all__ = ["LSN_SQL", "POLL_S", "Durable", "DurableLevels"]

# After COMMIT, outside the transaction: the insert position (>= the commit record's
# end) and the flushed one, as integers.
LSN_SQL = (
    "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8,"
    " (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::int8"
)
FLUSH_SQL = "SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::int8"

# How often the subscriber asks for the flushed LSN while levels wait and no batch
# brings it (seconds): the WAL writer flushes every wal_writer_delay (200 ms by
# default), so asking more often only costs round trips.
POLL_S = 0.01


class Durable:
    """Levels committed on the current connection, until its flushed WAL passes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the writer's thread records, the loop reads
        self._waiting: collections.deque[tuple[int, int]] = collections.deque()  # (level, lsn)
        self._level = 0  # the highest level known durable
        self.flush_read_at = 0.0  # monotonic time of the last flushed LSN read

    @property
    def level(self) -> int:
        return self._level

    @property
    def waiting(self) -> bool:
        """Levels committed and not yet known flushed."""
        return bool(self._waiting)

    def committed(self, level: int, commit_lsn: int, flushed_lsn: int, at: float) -> None:
        """A batch committed ``level``; its LSN and the flushed LSN read after COMMIT."""
        with self._lock:
            self._waiting.append((level, commit_lsn))
            self._flushed(flushed_lsn, at)

    def flushed(self, flushed_lsn: int, at: float) -> None:
        """The target's WAL is flushed up to ``flushed_lsn`` (read on this connection)."""
        with self._lock:
            self._flushed(flushed_lsn, at)

    def _flushed(self, flushed_lsn: int, at: float) -> None:
        self.flush_read_at = at
        while self._waiting and self._waiting[0][1] <= flushed_lsn:
            level = self._waiting.popleft()[0]
            self._level = max(self._level, level)

    def read_after_commit(self, conn: psycopg.Connection[Any], level: int) -> None:
        """``level`` just committed on ``conn`` (not pipelined): read its LSN and the
        flushed one now, one more round trip (module docstring)."""
        self.committed_row(level, conn.execute(LSN_SQL).fetchone())

    def committed_row(self, level: int, lsns: tuple[Any, ...] | None) -> None:
        """``level`` committed; ``lsns``: the row :data:`LSN_SQL` read after its COMMIT."""
        assert lsns is not None
        self.committed(level, lsns[0], lsns[1], time.monotonic())

    def read_back(self, level: int) -> None:
        """``level`` was read from the target and made durable (module docstring)."""
        with self._lock:
            self._waiting.clear()
            self._level = level

    def reset(self) -> None:
        """A new connection: the LSNs of the levels waiting mean nothing on it."""
        with self._lock:
            self._waiting.clear()


class DurableLevels:
    """:meth:`durable_level` of :class:`~subscriber.targets.postgres.writer.PostgresWriter`."""

    _durable: Durable
    _lock: threading.Lock  # the writer's: held while a batch is written
    _conn: psycopg.Connection[Any] | None
    _held: Any  # the open held group, if any (subscriber/targets/held.py)

    def durable_level(self, applied: int, *, poll: bool = False) -> tuple[int, bool]:
        """(the highest level up to ``applied`` the target holds durably, whether
        committed levels still wait for its WAL flush).  ``poll``: ask the server
        for its flushed LSN first, unless a batch brought it within ``POLL_S`` or
        the writer is busy (never waits for the apply: ``_durable.py``)."""
        durable = self._durable
        if poll and durable.waiting and self._lock.acquire(blocking=False):
            try:
                self._poll_flushed()
            finally:
                self._lock.release()
        return min(applied, durable.level), durable.waiting

    def _poll_flushed(self) -> None:
        conn, durable = self._conn, self._durable
        if conn is None or conn.closed or conn.broken or self._held.open:
            return  # the next batch connects again (and resets the waiting levels)
        now = time.monotonic()
        if now - durable.flush_read_at < POLL_S:
            return  # a batch just brought it
        try:
            row = conn.execute(FLUSH_SQL).fetchone()
        except psycopg.Error:
            return  # the next batch sees the connection's failure and says so
        if _trace.TRACE is not None:  # common/trace.py: the ack poller's round trip
            _trace.TRACE.event("flush_poll", ms=round((time.monotonic() - now) * 1000, 3))
        if row is not None:
            durable.flushed(int(row[0]), now)
