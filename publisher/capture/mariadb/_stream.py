"""One binary-log connection's worth of streaming (the argument is in the package docstring).

:class:`Session` opens the binary log after the lowest position of its publications
(``@slave_connect_state``), turns each transaction of the source database into at
most one entry per publication (fragments past ``max_entry_bytes``), logs install
snapshots once the stream has passed their GTID, and reports each transaction it is
done with (:meth:`BinlogCapture.done_upto`) for snapshots that wait for it.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql
import structlog
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    RowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from common.dburl import DatabaseUrl, mariadb_params
from common.rpc import txrepl_pb2 as pb
from publisher.capture.groups import GroupWriter
from publisher.capture.health import CaptureHealth
from publisher.capture.logs import Flusher
from publisher.capture.mariadb import _catalog as catalog
from publisher.capture.mariadb._gtid import (
    Pinned,
    at_domain,
    domain_of,
    gtid_of,
    pinned,
    position,
    seq_of,
)
from publisher.capture.mariadb._types import TableShape
from publisher.capture.source import SourceOptions
from publisher.errors import RowTooLarge, SourceError, key_text
from publisher.publication import Publication

__all__ = ["HEARTBEAT_S", "BinlogCapture", "Session"]

log = structlog.get_logger(__name__)

HEARTBEAT_S = 0.25  # the server's heartbeat on an idle binary log: how soon a halt is seen
_EVENTS = [
    MariadbGtidEvent,
    QueryEvent,
    XidEvent,
    WriteRowsEvent,
    UpdateRowsEvent,
    DeleteRowsEvent,
    HeartbeatLogEvent,
]


class BinlogCapture:
    """What outlives one session: the source, its domain, counters, and the done position."""

    def __init__(self, url: DatabaseUrl, options: SourceOptions) -> None:
        self.url = url
        self.options = options
        self.health = CaptureHealth()
        self.entries = 0
        self.changed = threading.Event()  # install() since the session read the installs
        self._done = threading.Condition()
        self._done_seq = -1  # the GTID seq the session has dealt with, -1: not streaming
        with contextlib.closing(catalog.connect(url)) as conn:
            default_domain = catalog.check_server(conn, url)
            self.domain = domain_of(catalog.gtid_position(conn), default_domain)
            self.database = str(conn.db.decode() if isinstance(conn.db, bytes) else conn.db)

    def done_upto(self, seq: int) -> None:
        with self._done:
            self._done_seq = seq
            self._done.notify_all()

    def wait_done(self, seq: int, timeout_s: float) -> None:
        """Until the stream has dealt with every transaction up to GTID seq ``seq``."""
        with self._done:
            if not self._done.wait_for(lambda: self._done_seq >= seq, timeout_s):
                raise SourceError(
                    f"MariaDB capture did not reach GTID seq {seq} in {timeout_s:g} s"
                    " (is the publisher's capture running?)"
                )


def _pymysql_connect(**kwargs: Any) -> Any:
    """PyMySQL's connect for the library, which still names the database ``db``."""
    if "db" in kwargs:
        kwargs["database"] = kwargs.pop("db")
    return pymysql.connect(**kwargs)


@dataclass
class _PubTxn:
    """One publication's part of the transaction being read."""

    entry: pb.Entry = field(default_factory=pb.Entry)
    size: int = 0
    group: GroupWriter | None = None


@dataclass
class _Txn:
    pos: int
    time_s: int
    pubs: dict[str, _PubTxn] = field(default_factory=dict)


class Session:
    """Reads the binary log for ``pubs`` until ``halt`` (or an error)."""

    def __init__(self, cap: BinlogCapture, pubs: Sequence[Publication]) -> None:
        self.cap = cap
        self.pubs = list(pubs)
        self.conn = catalog.connect(cap.url)
        self.flusher = Flusher([p.log for p in pubs], name="txrepl-maria-capture-flush")
        self.captured: dict[str, set[str]] = {}
        self.pending: dict[str, set[str]] = {}
        self.shapes: dict[str, TableShape] = {}
        self.logged: dict[tuple[str, str], TableShape] = {}
        self.txn: _Txn | None = None
        self.snap: contextlib.ExitStack | None = None
        self.pin: Pinned | None = None
        self.done_seq = 0

    # -- set-up -------------------------------------------------------------------------

    def _read_installs(self) -> None:
        self.cap.changed.clear()
        rows = catalog.installs(self.conn)
        for p in self.pubs:
            mine = {
                t: g
                for (name, t), (inc, g) in rows.items()
                if name == p.name and inc == p.log.incarnation
            }
            self.captured[p.name] = {t for t, g in mine.items() if g is not None}
            self.pending[p.name] = {t for t, g in mine.items() if g is None}
        if any(self.pending.values()) and self.pin is None:
            self.snap = contextlib.ExitStack()
            self.pin = self.snap.enter_context(pinned(self.cap.url, self.cap.domain))

    def run(self, halt: threading.Event) -> None:
        cap = self.cap
        reader: BinLogStreamReader | None = None
        try:
            starts = [p.position for p in self.pubs if p.position > 0]
            start = (
                min(starts) if starts else at_domain(catalog.gtid_position(self.conn), cap.domain)
            )
            self.done_seq = seq_of(start)
            self._read_installs()
            params = mariadb_params(cap.url, role="source")
            params.pop("database")
            reader = BinLogStreamReader(
                connection_settings={**params, "read_timeout": 60},
                server_id=random.randint(1 << 20, 1 << 30),  # two readers: two ids
                blocking=True,
                resume_stream=True,
                is_mariadb=True,
                auto_position=gtid_of(cap.domain, start),
                slave_heartbeat=HEARTBEAT_S,
                only_events=_EVENTS,
                only_schemas=[cap.database],
                # A table map seen before (same table id) is not parsed again: half of
                # capture's time otherwise.  Safe across ALTER TABLE: the server gives
                # the changed table a new id (the table's share is opened afresh), and a
                # new binary log file (a server restart) clears the map.
                freeze_schema=True,
                enable_logging=False,
                pymysql_wrapper=_pymysql_connect,
            )
            self.flusher.start()
            log.info("MariaDB capture streaming", start=gtid_of(cap.domain, start) or "(start)")
            cap.done_upto(self.done_seq)
            cap.health.ok()
            self._emit_snapshot()
            while not halt.is_set():
                ev = reader.fetchone()
                if self.flusher.error is not None:
                    raise self.flusher.error
                if ev is None:
                    raise SourceError("the MariaDB server ended the binary log stream")
                self._event(ev)
        finally:
            if reader is not None:
                reader.close()
            self.close()

    def close(self) -> None:
        txn, self.txn = self.txn, None
        if txn is not None:
            for pt in txn.pubs.values():
                if pt.group is not None:
                    pt.group.abort()
        self.flusher.stop()
        if self.snap is not None:
            self.snap.close()
            self.snap, self.pin = None, None
        self.conn.close()

    # -- events ---------------------------------------------------------------------------

    def _event(self, ev: object) -> None:
        if isinstance(ev, MariadbGtidEvent):
            if ev.domain_id != self.cap.domain:
                raise SourceError(
                    f"transaction {ev.gtid} is in GTID domain {ev.domain_id}; capture follows"
                    f" domain {self.cap.domain} only (docs/mariadb.md)"
                )
            pin = self.pin
            if pin is not None and ev.gtid_seq_no > seq_of(pin.pos):
                # Never reached when the snapshot's own transaction was read (it emits
                # then); kept so no change past the snapshot can precede its rows.
                self.done_seq = max(self.done_seq, seq_of(pin.pos))
                self._emit_snapshot()
            self.txn = _Txn(position(ev.server_id, ev.gtid_seq_no), int(ev.timestamp))
        elif isinstance(ev, RowsEvent):
            if self.txn is not None and ev.schema == self.cap.database:
                self._rows(ev)
        elif isinstance(ev, XidEvent):
            self._commit()
        elif isinstance(ev, QueryEvent):
            query = ev.query.strip().upper()
            if query == "BEGIN":
                return
            if query != "COMMIT":  # DDL: its own transaction (shapes re-read when rows differ)
                schema = ev.schema.decode() if isinstance(ev.schema, bytes) else ev.schema
                if schema == self.cap.database:
                    self.shapes.clear()
            self._commit()
        elif isinstance(ev, HeartbeatLogEvent):
            self._idle()

    def _idle(self) -> None:
        if self.cap.changed.is_set():
            self._read_installs()
        self._emit_snapshot()

    def _shape(self, table: str, names: list[str]) -> TableShape:
        shape = self.shapes.get(table)
        if shape is None or shape.names != names:
            shape = catalog.read_shape(self.conn, table)
            if shape.names != names:
                raise SourceError(
                    f"table {table!r}: the binary log has columns {names}, the catalog now"
                    f" {shape.names} (changed again since); capture cannot map these rows"
                    ' (docs/mariadb.md, "Schema changes")'
                )
            self.shapes[table] = shape
        return shape

    def _rows(self, ev: RowsEvent) -> None:
        txn = self.txn
        assert txn is not None
        table = str(ev.table)
        pubs = [p for p in self.pubs if table in self.captured[p.name] and txn.pos > p.position]
        if not pubs:
            return
        shape = self._shape(table, [c.name for c in ev.columns])
        names, conv, key_idx = shape.names, shape.convert, shape.key_idx
        for row in ev.rows:
            rc = pb.RowChange(table=shape.schema.table)
            if isinstance(ev, WriteRowsEvent):
                rc.op = pb.ROW_OP_INSERT
                after = row["values"]
                rc.row.extend(f(after[n]) for f, n in zip(conv, names, strict=True))
            elif isinstance(ev, UpdateRowsEvent):
                rc.op = pb.ROW_OP_UPDATE
                before, after = row["before_values"], row["after_values"]
                rc.key.extend(conv[i](before[names[i]]) for i in key_idx)
                rc.row.extend(f(after[n]) for f, n in zip(conv, names, strict=True))
            else:
                rc.op = pb.ROW_OP_DELETE
                before = row["values"]
                rc.key.extend(conv[i](before[names[i]]) for i in key_idx)
            op = pb.Op(row=rc)
            for p in pubs:
                if self.logged.get((p.name, table)) is not shape:
                    self._add(p, txn, pb.Op(schema=shape.schema), key_idx)
                    self.logged[(p.name, table)] = shape
                self._add(p, txn, op, key_idx)

    def _add(self, pub: Publication, txn: _Txn, op: pb.Op, key_idx: Sequence[int]) -> None:
        """Add ``op`` to ``pub``'s entry; past ``max_entry_bytes``, as a fragment (groups.py)."""
        pt = txn.pubs.setdefault(pub.name, _PubTxn())
        size = op.ByteSize() + 6
        limit = self.cap.options.max_entry_bytes
        if size > limit:
            raise RowTooLarge(
                publication=pub.name,
                table=op.row.table,
                key=key_text(op.row, key_idx),
                size=size,
                limit=limit,
            )
        if pt.size + size > limit and pt.entry.ops:
            if pt.group is None:
                pt.group = GroupWriter(pub)
            pt.entry.commit_time_us = int(time.time() * 1_000_000)
            pt.group.add(pt.entry, txn.pos)
            pt.entry, pt.size = pb.Entry(), 0
        pt.entry.ops.append(op)
        pt.size += size

    def _commit(self) -> None:
        txn, self.txn = self.txn, None
        if txn is None:
            return
        now = time.time()
        # The log's commit time has seconds only: within the second, now is closer.
        stamp = now if now - txn.time_s < 1 else txn.time_s
        for p in self.pubs:
            pt = txn.pubs.get(p.name)
            if pt is None:
                if txn.pos > p.position:
                    p.advance(txn.pos)
                continue
            pt.entry.commit_time_us = int(stamp * 1_000_000)
            if pt.group is None:
                p.append(pt.entry, position=txn.pos, wait=False)
            else:
                pt.group.add(pt.entry, txn.pos)
                pt.group.finish(txn.pos)
            self.cap.entries += 1
        self.flusher.kick()
        self.done_seq = seq_of(txn.pos)
        self.cap.done_upto(self.done_seq)
        self._emit_snapshot()

    # -- install snapshots ----------------------------------------------------------------

    def _emit_snapshot(self) -> None:
        """Log the pending tables' rows once the stream has passed the snapshot's GTID."""
        pin = self.pin
        if pin is None or self.done_seq < seq_of(pin.pos):
            return
        for p in self.pubs:
            tables = sorted(self.pending[p.name])
            if not tables:
                continue
            for t in tables:
                if p.log.head:
                    p.log.flush()  # what came before is durable before the group starts
                self._log_rows(p, t, pin)
            catalog.record_snapshot(self.conn, p.name, tables, pin.gtid)
            self.captured[p.name] |= set(tables)
            self.pending[p.name] = set()
            log.info("capture installed", publication=p.name, tables=tables, gtid=pin.gtid)
        assert self.snap is not None
        self.snap.close()
        self.snap, self.pin = None, None

    def _log_rows(self, pub: Publication, table: str, pin: Pinned) -> None:
        """``table``'s schema, a TRUNCATE, and its rows as of ``pin``: one group at its GTID."""
        shape = catalog.read_shape(pin.conn, table)
        txn = _Txn(pin.pos, int(time.time()))
        self._add(pub, txn, pb.Op(schema=shape.schema), ())
        truncate = pb.RowChange(table=shape.schema.table, op=pb.ROW_OP_TRUNCATE)
        self._add(pub, txn, pb.Op(row=truncate), ())
        for chunk in pin.chunks(table, 1000):
            for r in chunk.rows.rows:
                rc = pb.RowChange(table=shape.schema.table, op=pb.ROW_OP_INSERT)
                rc.row.extend(r.values)
                self._add(pub, txn, pb.Op(row=rc), shape.key_idx)
        pt = txn.pubs[pub.name]
        pt.entry.commit_time_us = int(time.time() * 1_000_000)
        group = pt.group or GroupWriter(pub)
        group.add(pt.entry, pin.pos)
        group.finish(pin.pos)
        self.logged[(pub.name, table)] = shape
        self.shapes[table] = shape
        self.cap.entries += 1
