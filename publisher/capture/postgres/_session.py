"""One replication connection's worth of streaming, and the flusher beside it.

:class:`Session` reads the slot (pgoutput or wal2json), turns each decoded
transaction into one entry per publication that has a table it touched, logs
install snapshots when the stream crosses their consistent point, resolves
``wait_position`` marks, and confirms the slot only past durable entries.
:class:`~publisher.capture.logs.Flusher` makes the appends durable in rounds while
decoding goes on.
The argument for order and exactly-once is in the package docstring.

Large transactions (issue 21, ``common/fragments.py``): a transaction's ops for
a publication are held only up to ``max_entry_bytes``; the op that would go
over sends what is held to the log as a fragment of the transaction's group
(:class:`GroupWriter`, every fragment but the last at the position before the
transaction), and the commit appends the last one at the commit LSN.  Memory
per publication: the ops held plus one fragment kept back.  A publication whose
single row change is over the limit is refused (``cap.refused``, its open group
aborted, one error line naming table and key) and the slot is confirmed no
further, so its changes stay in the WAL for a restart with a larger limit; the
other publications go on.  A session that ends inside a transaction aborts the
groups it opened (:meth:`Session.close`); kill -9 leaves that to the next open.

Transactions read back to back (a backlog) are appended together: ``_confirm.py``
has the rule and its ordering argument.

The read loop (:meth:`Session.run`) makes no Python object for a Begin, a Commit
or a row of a known relation (the three messages of nearly every transaction):
their fields are unpacked where they are read.  In sync each transaction is one
wake-up (``poll``, registered once) and this loop's pass; a W1 transaction costs
the thread about 0.13 ms of CPU at 1,000 txn/s against 0.03 ms in a backlog
(docs/performance.md has where the rest goes).
"""

from __future__ import annotations

import select
import struct
import threading
from collections.abc import Sequence
from typing import Any

import structlog

from common import trace as _trace
from common.calls import BEGIN_PREFIX, END_PREFIX
from common.constraints import for_publication
from common.origin import node_of_pg_origin
from common.rpc import txrepl_pb2 as pb
from publisher.capture.calls import CallScope, read_call
from publisher.capture.groups import GroupWriter
from publisher.capture.logs import Flusher, last_before
from publisher.capture.postgres._backlog import Backlog
from publisher.capture.postgres._confirm import Confirming
from publisher.capture.postgres._core import CaptureCore
from publisher.capture.postgres._ddlwatch import PREFIX, DdlWatch
from publisher.capture.postgres._evolve import needs_copy, request_copy
from publisher.capture.postgres._partitions import relkind, set_full
from publisher.capture.postgres._pgcatalog import TableName, TableShape
from publisher.capture.postgres._pgoutput import (
    PG_EPOCH_US,
    UNCHANGED,
    Begin,
    Commit,
    Datum,
    Delete,
    Event,
    Insert,
    Message,
    Origin,
    Relation,
    Truncate,
    Update,
    parse_pgoutput,
)
from publisher.capture.postgres._pgwal2json import WAL2JSON_OPTIONS, OriginNames, Wal2JsonDecoder
from publisher.capture.postgres._pgwire import RowWriter
from publisher.capture.postgres._sequences import SequencePositions
from publisher.capture.postgres._state import (
    PendingSnapshot,
    PubState,
    RelState,
    TableState,
    Txn,
)
from publisher.capture.protowire import entry_of, framed
from publisher.errors import RowTooLarge, SourceError, key_text
from publisher.publication import Encoded, Publication

__all__ = ["Flusher", "Session", "last_before"]

log = structlog.get_logger(__name__)

_MARKS = (BEGIN_PREFIX, END_PREFIX)  # procedure call marks (common/calls.py)
_ROWS = (Insert, Update, Delete)
_ROW_TAGS = frozenset(b"IUD")  # their pgoutput messages
_U32 = struct.Struct(">I").unpack_from
_BEGIN = struct.Struct(">QqI").unpack_from  # as _pgoutput.py reads them (no event)
_COMMIT = struct.Struct(">bQQq").unpack_from
# Entries of transactions read back to back are appended together, up to this many
# (_drain): one lock, one framing call and one flusher kick per group.
_QUEUE_MAX = 128


class Session(Confirming):
    """One replication connection's worth of streaming (reconnects make a new one)."""

    def __init__(
        self, cap: CaptureCore, pubs: Sequence[Publication], halt: threading.Event
    ) -> None:
        self.cap = cap
        self.halt = halt
        self.pubs = pubs
        self.state: dict[str, PubState] = {}
        self.routes: dict[str, list[tuple[PubState, TableState]]] = {}
        self.watched: dict[str, str] = {}  # display name -> SQL name, of the routes' tables
        self.rels: dict[int, RelState] = {}
        self.prev_shapes: dict[int, TableShape] = {}
        self.txn: Txn | None = None
        self.pending: PendingSnapshot | None = None
        self.conn: Any = None
        self.cur: Any = None
        self.confirmable = 0  # end LSN of the last transaction handled (logged or not)
        self.confirmed = 0
        self.touched: set[str] = set()
        self.hold: int | None = None  # confirm the slot no further (a publication refused)
        self.last_feedback = 0.0
        self.backlog = Backlog(pubs)  # reading a backlog (_backlog.py)
        self.commit_time_us = 0  # of the last commit read
        # Transactions read back to back, their entries not yet appended (_drain).
        self.queued: list[tuple[Publication, Encoded]] = []
        self.wal2json = (
            Wal2JsonDecoder(OriginNames(cap._admin, cap._lock))
            if cap.plugin == "wal2json"
            else None
        )
        self.flusher = Flusher([p.log for p in pubs])
        self.watch: DdlWatch | None = DdlWatch(cap._admin, cap._lock)
        self.sequences = SequencePositions(cap._admin, cap._lock)

    def close(self) -> None:
        self.backlog.clear()
        if self.txn is not None:
            for group in self.txn.groups.values():
                group.abort()  # left inside a transaction: closed as abandoned (P3)
        self.flusher.stop()
        if self.pending is not None:
            self.pending.conn.close()
            self.pending = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _reload(self) -> None:
        self._drain()  # _load compares the publications' positions
        self.cap._dirty.clear()
        self.sequences.forget()
        old = self.state
        self.state = self.cap._load(self.pubs)
        for name, ps in self.state.items():
            for t, tab in ps.tables.items():
                prev = old.get(name)
                if prev is not None and t in prev.tables and prev.tables[t].complete:
                    tab.logged = prev.tables[t].logged  # newer than the saved one
        self.routes = {}
        for ps in self.state.values():
            for t, tab in ps.tables.items():
                self.routes.setdefault(t, []).append((ps, tab))
        # made here, not at every idle moment (in sync: once or twice per transaction)
        self.watched = {t: tab.name.sql for t, routes in self.routes.items() for _ps, tab in routes}
        if self.pending is None:
            self.pending = self.cap._begin_snapshot(self.state)

    def run(self) -> None:
        cap = self.cap
        self._reload()
        self.conn = cap._replication_conn()
        self.cur = self.conn.cursor()
        options = (
            {"proto_version": "1", "publication_names": cap.pg_publication, "messages": "true"}
            if cap.plugin == "pgoutput"
            else dict(WAL2JSON_OPTIONS)
        )
        self.cur.start_replication(
            slot_name=cap.slot, decode=False, options=options, status_interval=5
        )
        log.info("capture streaming", slot=cap.slot, plugin=cap.plugin)
        cap.health.ok()
        self.flusher.start()
        poller = select.poll()
        poller.register(self.conn.fileno(), select.POLLIN)
        poll = poller.poll
        read, handle, halt = self.cur.read_message, self._handle, self.halt
        done = 0  # cap.transactions at the last commit paced
        backlog = self.backlog
        while not halt.is_set():
            if self.flusher.error is not None:
                raise self.flusher.error
            if cap._dirty.is_set() and self.txn is None:
                self._reload()
            msg = read()
            if msg is not None:
                backlog.dry = 0.0
                handle(msg.payload)
                while self.txn is not None and not halt.is_set():
                    msg = read()  # the rest of the transaction, back to back
                    if msg is None:
                        break
                    handle(msg.payload)
                if self.txn is None:
                    if len(self.queued) >= _QUEUE_MAX:
                        self._drain()
                    self._feedback()
                    if cap.transactions != done:  # msg was a commit
                        done = cap.transactions
                        backlog.committed(done, msg, self.commit_time_us)
                continue
            self._drain()  # nothing more to read now: what was read goes to the logs
            self._idle()
            poll(200)
            if _trace.TRACE is not None:  # common/trace.py: when the capture woke
                _trace.TRACE.event(
                    "capture_woke", transactions=cap.transactions, mid=self.txn is not None
                )
            backlog.nothing_read()
        self._drain()
        if self.txn is None:
            self._feedback(force=True)

    # -- stream events ---------------------------------------------------------------

    def _handle(self, payload: bytes) -> None:
        if self.wal2json is not None:
            for ev in self.wal2json.decode(payload):
                self._event(ev)
            return
        first = payload[0] if payload else 0
        if first in _ROW_TAGS and len(payload) > 5:  # most messages are row changes
            # A row of a relation seen before, text and NULL cells only (nearly all):
            # read straight into its Op's bytes (_pgwire.py), no event made.
            (oid,) = _U32(payload, 1)
            r = self.rels.get(oid)
            if r is not None and r.writer is not None and r.shape is not None:
                op = r.writer.from_message(payload)
                if op is not None:
                    targets = self._targets(r.display)
                    if targets:
                        self._add(r, r.shape, targets, op, first == 0x49)
                    return
        elif first == 0x42 and len(payload) == 21:  # Begin: no event made either
            lsn, ts, _xid = _BEGIN(payload, 1)
            # _cross does nothing without a pending snapshot or a mark: not called then
            if self.pending is not None or self.cap._marks:
                if self.queued:
                    self._drain()  # a crossing appends, a mark reads the heads
                self._cross(lsn)
            self.txn = Txn(lsn, ts + PG_EPOCH_US)
            return
        elif first == 0x43 and len(payload) == 26:  # Commit: no event made either
            _flags, lsn, end, ts = _COMMIT(payload, 1)
            self._commit(lsn, end, ts + PG_EPOCH_US)
            return
        event = parse_pgoutput(payload)
        if isinstance(event, _ROWS):
            self._change(event)
        elif event is not None:
            self._event(event)

    def _event(self, ev: Event) -> None:
        if isinstance(ev, _ROWS):
            self._change(ev)
        elif isinstance(ev, Begin):
            if self.queued and (self.pending is not None or self.cap._marks):
                self._drain()  # a crossing appends, a mark reads the heads
            self._cross(ev.final_lsn)
            self.txn = Txn(ev.final_lsn, ev.commit_time_us)
        elif isinstance(ev, Commit):
            self._commit(ev.commit_lsn, ev.end_lsn, ev.commit_time_us)
        elif isinstance(ev, Relation):
            prev = self.rels.get(ev.oid)
            if prev is not None and prev.shape is not None:
                # its key stands in if the table is gone from the catalog by now
                self.prev_shapes[ev.oid] = prev.shape
            self.rels[ev.oid] = RelState(TableName(ev.namespace, ev.name), ev)
            self.sequences.forget(self.rels[ev.oid].display)  # its columns changed
        elif isinstance(ev, Truncate):
            self._truncate(ev)
        elif isinstance(ev, Origin) and self.txn is not None:
            self.txn.origin = node_of_pg_origin(ev.name)  # common/origin.py, R2
        elif isinstance(ev, Message) and ev.prefix == PREFIX and self.txn is not None:
            self._ddl(ev.content.decode())
        elif isinstance(ev, Message) and ev.prefix in _MARKS and self.txn is not None:
            self._call(ev)

    def _targets(self, table: str) -> list[tuple[PubState, TableState]]:
        txn = self.txn
        assert txn is not None
        return [
            (ps, tab)
            for ps, tab in self.routes.get(table, ())
            if tab.complete
            and txn.final_lsn > ps.pub.position
            and ps.pub.name not in self.cap.refused
            and not (txn.calls and txn.calls[ps.pub.name].hiding)
        ]

    def _call(self, ev: Message) -> None:
        """A procedure call's mark (publisher/capture/calls.py): record the call where
        it stands for the publications that carry it; they hide its rows until its end."""
        txn = self.txn
        assert txn is not None
        if ev.prefix == END_PREFIX:
            for scope in txn.calls.values():
                scope.end()
            return
        call = read_call(ev.content)
        for name, ps in self.state.items():
            scope = txn.calls.setdefault(name, CallScope(ps.pub.config.procedures))
            ready = (
                txn.final_lsn > ps.pub.position
                and name not in self.cap.refused
                and bool(ps.tables)
                and all(t.complete for t in ps.tables.values())
            )
            if scope.begin(call, ready):
                assert call is not None
                op = pb.Op(call=call).SerializeToString()
                size = len(op) + 6
                if self._room(ps, pb.RowChange(table=f"call {call.name}"), size, ()):
                    txn.ops.setdefault(name, []).append(op)
                    txn.sizes[name] += size

    def _shape(self, r: RelState) -> TableShape:
        if r.shape is None:
            r.shape = self.cap._cat().shape(r.name, r.rel.columns, self.prev_shapes.get(r.rel.oid))
        return r.shape

    def _ops(self, ps: PubState, tab: TableState, shape: TableShape) -> list[bytes]:
        txn = self.txn
        assert txn is not None
        ops = txn.ops.setdefault(ps.pub.name, [])
        if tab.seen is shape and tab.logged is tab.seen_schema:
            return ops  # the shape of the last row, its schema logged: nothing to compare
        schema = for_publication(shape.schema, ps.tables)
        tab.seen = shape
        if tab.logged is schema or tab.logged == schema:
            tab.seen_schema = tab.logged
        else:
            tab.seen_schema = schema
            if tab.logged is not None and needs_copy(
                tab.logged, schema, lambda names: self.cap._cat().filled(tab.name, names)
            ):
                txn.recopy.append((ps.pub.name, tab.name.display))
            ops.append(pb.Op(schema=schema).SerializeToString())
            txn.sizes[ps.pub.name] = txn.sizes.get(ps.pub.name, 0) + len(ops[-1]) + 6
            tab.logged = schema
            txn.logged.append((ps.pub.name, schema.table, schema))
        return ops

    def _ddl(self, tables: str) -> None:
        """A ``_ddlwatch`` message: log the named tables' schemas that moved."""
        for display in tables.split("\n"):
            targets = self._targets(display)
            if not targets:
                continue
            try:
                shape = self.cap.current_shape(targets[0][1].name)
            except SourceError:
                continue  # gone since: nothing to follow
            for ps, tab in targets:
                self._ops(ps, tab, shape)

    def _change(self, ev: Insert | Update | Delete) -> None:
        r = self.rels.get(ev.oid)
        if r is None:
            raise SourceError(f"change for relation {ev.oid} before its relation message")
        targets = self._targets(r.display)
        if not targets:
            return
        shape = self._shape(r)
        writer = r.writer
        if writer is None:
            writer = r.writer = RowWriter(r.display, shape.infos, shape.key_idx)
        if isinstance(ev, Insert):
            op = writer.insert(ev.new)
        elif isinstance(ev, Update):
            new, old = ev.new, ev.old
            if UNCHANGED in new:
                if old is None and self._copy_instead(r, targets):
                    return
                new = self._fill_unchanged(r, new, old)
            op = writer.update(old if old is not None else new, new)
        else:
            op = writer.delete(ev.old)
        self._add(r, shape, targets, op, isinstance(ev, Insert))

    def _add(
        self,
        r: RelState,
        shape: TableShape,
        targets: list[tuple[PubState, TableState]],
        op: bytes,
        inserting: bool,
    ) -> None:
        """Hold the row change ``op`` (a serialized Op) for each of ``targets``."""
        cap = self.cap
        cap.changes += 1
        size = len(op) + 6  # with its tag and length in the entry (an Op's ByteSize + 6)
        txn = self.txn
        assert txn is not None
        sizes = txn.sizes
        for ps, tab in targets:
            name = ps.pub.name
            # Room made (a fragment sent, or the publication refused) only near the limit.
            held = sizes.get(name, 0)
            if held + size > cap.max_entry_bytes and not self._room(ps, op, size, shape.key_idx):
                continue
            if tab.seen is shape and tab.logged is tab.seen_schema:
                ops = txn.ops.get(name)  # the shape of the last row, its schema logged
                if ops is None:
                    ops = txn.ops[name] = []
            else:
                ops = self._ops(ps, tab, shape)
            ops.append(op)
            sizes[name] = sizes.get(name, 0) + size
            if inserting:
                txn.inserted.setdefault(name, {})[r.name] = None

    def _room(
        self, ps: PubState, op: pb.RowChange | bytes, size: int, key_idx: Sequence[int]
    ) -> bool:
        """Make room for an op of ``size`` bytes: send a fragment if it would not fit.

        False when the op alone is over the limit: the publication is refused (``op``,
        a serialized row Op or the RowChange that names it, says which row).
        """
        txn = self.txn
        assert txn is not None
        name, limit = ps.pub.name, self.cap.max_entry_bytes
        if size > limit:
            rc = op if isinstance(op, pb.RowChange) else pb.Op.FromString(op).row
            self._refuse(name, rc, key_idx, size)
            txn.ops.pop(name, None)
            group = txn.groups.pop(name, None)
            if group is not None:
                group.abort()
            return False
        held = txn.sizes.setdefault(name, 0)
        if held and held + size > limit:
            entry = entry_of(txn.ops.pop(name))
            entry.commit_time_us = txn.commit_time_us
            entry.origin = txn.origin
            txn.sizes[name] = 0
            group = txn.groups.get(name)
            if group is None:
                self._drain()  # the transactions before it first
                group = txn.groups[name] = GroupWriter(ps.pub)
            group.add(entry, ps.pub.position)
            self.touched.add(name)
        return True

    def _refuse(self, name: str, rc: pb.RowChange, key_idx: Sequence[int], size: int) -> None:
        """A row change of ``size`` bytes fits in no entry: publication ``name`` stops here."""
        limit = self.cap.max_entry_bytes
        exc = RowTooLarge(
            publication=name, table=rc.table, key=key_text(rc, key_idx), size=size, limit=limit
        )
        self.cap.refused[name] = exc
        self.hold = self.confirmable if self.hold is None else min(self.hold, self.confirmable)
        log.error("capture refused", publication=name, table=rc.table, error=str(exc))

    def _copy_instead(self, r: RelState, targets: list[tuple[PubState, TableState]]) -> bool:
        """A partition made while capture runs lacks FULL (_partitions.py): copy the table."""
        cap, txn = self.cap, self.txn
        assert txn is not None
        if any(t == r.name.display for _, t in txn.recopy):
            return True  # copied after this transaction already
        with cap._lock:
            if relkind(cap._admin(), r.name.sql) != "p":
                return False
            left = set_full(cap._admin(), r.name.sql, cap.lock_timeout_s)
        log.warning("partition lacking full identity: table copied", table=r.name.sql, left=left)
        txn.recopy.extend((ps.pub.name, r.name.display) for ps, _ in targets)
        return True

    def _fill_unchanged(
        self, r: RelState, new: tuple[Datum, ...], old: tuple[Datum, ...] | None
    ) -> tuple[Datum, ...]:
        if old is None or len(old) != len(new):
            raise SourceError(
                f"table {r.name.display!r}: an update left a TOASTed value out and the old "
                "row is missing; its REPLICA IDENTITY must be FULL (the publisher sets it "
                "when installing; restore it with ALTER TABLE ... REPLICA IDENTITY FULL)"
            )
        return tuple(o if n is UNCHANGED else n for n, o in zip(new, old, strict=True))

    def _truncate(self, ev: Truncate) -> None:
        for oid in ev.oids:
            r = self.rels.get(oid)
            if r is None:
                continue
            txn = self.txn
            assert txn is not None
            options = (1 if ev.cascade else 0) | (2 if ev.restart_identity else 0)
            for ps, _tab in self._targets(r.name.display):
                # no schema op needed: the table's next row brings one if it changed
                ops = txn.ops.setdefault(ps.pub.name, [])
                rc = pb.RowChange(
                    table=r.name.display, op=pb.ROW_OP_TRUNCATE, truncate_options=options
                )
                ops.append(pb.Op(row=rc).SerializeToString())

    def _commit(self, commit_lsn: int, end_lsn: int, commit_time_us: int) -> None:
        txn = self.txn
        if txn is None:
            raise SourceError("commit without a transaction in the stream")
        self.txn = None
        self.commit_time_us = commit_time_us
        inserted = txn.inserted
        positions = (
            self.sequences.read(t for ts in inserted.values() for t in ts)
            if inserted and self.sequences.owning(inserted.values())
            else ()
        )
        for pubname, ops in txn.ops.items():
            if not ops:
                continue
            ps = self.state[pubname]
            seqs: list[pb.SequencePosition] = []
            if positions and pubname in txn.inserted:
                mine = {t.display for t in txn.inserted[pubname]}
                seqs = [p for p in positions if p.table in mine]
            group = txn.groups.get(pubname)
            if group is not None:
                entry = entry_of(ops)
                entry.commit_time_us = commit_time_us
                entry.origin = txn.origin
                entry.sequences.extend(seqs)
                group.add(entry, commit_lsn)
            else:  # the entry not built: its bytes written (publication.py), by _drain
                item = (framed(ops), commit_lsn, commit_time_us, txn.origin, seqs)
                self.queued.append((ps.pub, item))
            self.touched.add(pubname)
        if txn.groups:
            for group in txn.groups.values():
                self.cap.entries += group.finish(commit_lsn)
            self.flusher.kick()
        if txn.recopy or txn.logged:
            self._drain()  # durable below, before the copy is asked or the schema saved
        for pubname, table in txn.recopy:
            # Before the new schema is saved and the slot confirmed: see _evolve.
            request_copy(self.cap, pubname, table)
            self.state[pubname].tables[table].recopy = True
        for pubname, table, schema in txn.logged:
            self.state[pubname].pub.log.flush()  # the schema op is durable before it is saved
            self.cap._save_logged(pubname, table, schema, done=False)
        self.cap.transactions += 1
        self.confirmable = max(self.confirmable, end_lsn)
        if txn.recopy and self.pending is None:
            self.pending = self.cap._begin_snapshot(self.state)
