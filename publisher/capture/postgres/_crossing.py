"""Install snapshots logged where the stream crosses their consistent point.

Part of :class:`~publisher.capture.postgres._session.Session`.  An install (or a
table whose shape needs a copy, _evolve.py) exports a snapshot at a consistent
point C (``PendingSnapshot``, _core.py); the session goes on decoding, and when
the stream reaches C (a transaction committing at or after it, or the server's
keepalive past it, ``_idle``) every pending table is logged there: its schema, a
TRUNCATE, then its rows read through the exported snapshot, in entries cut at
``snapshot_chunk_rows`` and ``max_entry_bytes``.  Every entry but the very last
of the snapshot is at position C - 2 and the last at C - 1, so a crash in the
middle leaves the snapshot incomplete (retaken on restart) and every transaction
after C follows it in the log (__init__.py, "Ordering").  A table whose shape
changed after the snapshot was taken (``StaleSnapshot``) appends nothing and is
taken again by the next one; a row over ``max_entry_bytes`` refuses the
publication and leaves the table incomplete.  ``wait_position`` marks (on-demand
snapshots, publisher/snapshot.py) at or below the crossing are resolved first,
once the heads they hand out are durable.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import structlog

from common.constraints import for_publication
from common.rpc import txrepl_pb2 as pb
from publisher.capture.logs import last_before
from publisher.capture.postgres._core import CaptureCore
from publisher.capture.postgres._pgtypes import to_value
from publisher.capture.postgres._sequences import SequencePositions
from publisher.capture.postgres._stale import STALE_ERRORS, StaleSnapshot
from publisher.capture.postgres._state import PendingSnapshot, PubState, TableState, format_lsn

__all__ = ["SnapshotCrossing"]

log = structlog.get_logger(__name__)


class SnapshotCrossing:
    """``_cross`` (with ``_mark`` and ``_log_snapshot``) of :class:`Session`."""

    cap: CaptureCore
    state: dict[str, PubState]
    pending: PendingSnapshot | None
    sequences: SequencePositions
    touched: set[str]

    def _refuse(self, name: str, rc: pb.RowChange, key_idx: Sequence[int], size: int) -> None:
        raise NotImplementedError

    def _keepalive(self) -> None:
        raise NotImplementedError

    def _mark(self, lsn: int) -> None:
        """Resolve the wait_position requests at or below ``lsn`` (no transaction open)."""
        cap = self.cap
        if not cap._marks:
            return  # none asked (as if asked after this look: the next one resolves it)
        with cap._marks_lock:
            due = [m for m in cap._marks if m.lsn <= lsn and not m.done.is_set()]
        if not due:
            return
        for ps in self.state.values():
            ps.pub.log.flush()  # the seqs handed out are durable
        for m in due:
            m.heads = {name: last_before(ps.pub, m.lsn) for name, ps in self.state.items()}
            m.done.set()

    def _cross(self, lsn: int) -> None:
        """Log pending snapshots once the stream reaches their consistent point."""
        pending = self.pending
        if pending is None or lsn < pending.lsn:
            self._mark(lsn)
            return
        self._mark(pending.lsn)  # on-demand snapshots older than this install's rows
        for pubname, tables in pending.tables.items():
            ps = self.state[pubname]
            for i, t in enumerate(tables):
                if pubname in self.cap.refused:
                    break  # refused while logging: the rest waits for the restart too
                last_table = i == len(tables) - 1
                try:
                    self._log_snapshot(ps, ps.tables[t], pending, last_table)
                except StaleSnapshot as e:
                    # nothing of it was appended; the next snapshot takes it again
                    log.info("table snapshot retaken", table=t, why=str(e))
        pending.conn.close()
        self.pending = None
        log.info("snapshots logged", lsn=format_lsn(pending.lsn), tables=pending.tables)
        # tables installed while this snapshot was pending get the next one
        self.pending = self.cap._begin_snapshot(self.state)
        self._mark(lsn)

    def _log_snapshot(
        self, ps: PubState, tab: TableState, pending: PendingSnapshot, last_table: bool
    ) -> None:
        """Append schema, TRUNCATE and rows; the last entry of the last table at C - 1."""
        pub = ps.pub
        display = tab.name.display
        rows = 0
        chunks = self.cap._read_snapshot(pending, tab.name, self._keepalive)
        with contextlib.closing(chunks) as it:
            try:
                shape, _ = next(it)
            except STALE_ERRORS as e:
                raise StaleSnapshot(f"table {display!r} changed after the snapshot") from e
            schema = for_publication(shape.schema, ps.tables)
            entry = pb.Entry(commit_time_us=int(time.time() * 1_000_000))
            entry.ops.append(pb.Op(schema=schema))
            entry.ops.append(pb.Op(row=pb.RowChange(table=display, op=pb.ROW_OP_TRUNCATE)))
            size, limit = entry.ByteSize(), self.cap.max_entry_bytes
            for _, chunk in it:
                for row in chunk:
                    rc = pb.RowChange(table=display, op=pb.ROW_OP_INSERT)
                    rc.row.extend(to_value(d, i) for d, i in zip(row, shape.infos, strict=True))
                    op = pb.Op(row=rc)
                    n = op.ByteSize() + 6  # with its tag and length in the entry
                    if n > limit:
                        # the table stays incomplete: a restart with a larger limit retakes it
                        self._refuse(pub.name, rc, shape.key_idx, n)
                        return
                    if len(entry.ops) >= self.cap.snapshot_chunk_rows or size + n > limit:
                        # not the last entry: a crash now leaves the snapshot incomplete
                        pub.append(entry, position=pending.lsn - 2)
                        self.cap.entries += 1
                        entry = pb.Entry(commit_time_us=int(time.time() * 1_000_000))
                        size = 0
                    entry.ops.append(op)
                    size += n
                rows += len(chunk)
        entry.sequences.extend(self.sequences.read([tab.name]))  # _sequences.py
        pub.append(entry, position=pending.lsn - 1 if last_table else pending.lsn - 2)
        self.cap.entries += 1
        tab.complete = True
        tab.recopy = False
        tab.logged = schema
        self.touched.add(pub.name)
        self.cap._save_logged(pub.name, display, schema, done=True)
        log.info("table snapshot logged", publication=pub.name, table=display, rows=rows)
