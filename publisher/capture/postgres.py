"""Log-based capture from a PostgreSQL source, through logical decoding on a slot.

How it works
============
One **replication slot** per publisher source (named by the configuration, created by
the publisher with the ``pgoutput`` plugin, or ``wal2json``) streams every committed
transaction, whole and in commit order.  For pgoutput the publisher also owns a
PostgreSQL publication ``txrepl_<slot>`` holding every published table.  What is
installed lives in the source, in ``_txrepl.installs`` (one row per slot, publication
and table: the log incarnation, the LSN of the table's snapshot, the schema last logged).

* Entries.  A decoded transaction becomes ONE entry in each publication that has a
  table it touched (a transaction touching two publications makes two entries), with
  ``source_position`` = its commit LSN (where the commit record starts, the order of
  commits), appended through :meth:`Publication.append`.
* Full rows.  Installation sets ``REPLICA IDENTITY FULL`` on each published table, so
  updates and deletes carry the whole old row; an unchanged TOASTed value (pgoutput
  sends ``u``, wal2json leaves the column out) is taken from that old row.
* Exactly once.  The slot's confirmed flush LSN moves to a transaction's end only after
  its entries are durable in every publication log (``Log.flush()`` before each status
  update).  On restart the slot replays from its confirmed position and each
  publication skips transactions whose commit LSN is ``<=`` its ``position`` (the
  position of its log's newest entry).  Each log receives transactions in commit order
  and a transaction is appended to all its publications before the next is looked at,
  so every log holds a prefix of the stream: nothing lost, nothing doubled.
  A transaction's entries are appended without waiting for their fsync
  (``wait=False``); a flusher thread of the session makes them durable, and so visible
  to feeds, in rounds that take whatever was appended meanwhile, while decoding goes
  on.  So one fsync no longer costs every transaction (group commit across
  transactions), and nothing is sent that is not durable: a log's readers see only
  its durable head.  A schema recorded in ``_txrepl.installs`` is saved only after the
  entry carrying its schema op is durable.
* Existing rows (snapshot alignment).  Installing a table locks it ``IN SHARE MODE``
  (waiting out in-flight writers), sets the replica identity and adds it to the
  PostgreSQL publication, all in one transaction.  When capture runs it creates a
  temporary slot with an exported snapshot; its consistent point ``C`` splits the
  transactions exactly: those whose commit LSN is ``< C`` are visible in the snapshot,
  those ``>= C`` are decoded (PostgreSQL's own table synchronisation rests on the same
  fact).  ``C`` is recorded in ``_txrepl.installs`` first; then, when the main stream
  reaches ``C`` (the first transaction with commit LSN ``>= C``, or a keepalive at or
  past ``C``), the table's schema op, a TRUNCATE, and its rows read under the exported
  snapshot are appended (entries of ``snapshot_chunk_rows`` rows; positions ``C - 2``
  for all but the last, ``C - 1`` for the last), and only from then on are the table's
  streamed changes logged.  A snapshot is complete iff the publication's position is
  ``>= C - 1`` (WAL records start on 8-byte boundaries, so no commit has LSN ``C - 1``
  or ``C - 2``); one cut short by a crash is taken again with a fresh ``C`` (and its
  leading TRUNCATE clears the rows of the partial one on the target).  A publication
  whose log is new (new incarnation, position 0) is snapshotted afresh the same way.
* Schema changes.  Each relation message (wal2json: each change of a table's column
  list) gives the columns and types as of the decoded WAL; when they differ from the
  schema last logged for a publication, a schema op precedes the row that needs it in
  that publication's entry.  The schema last logged is saved to ``_txrepl.installs``
  after the append (a crash in between only repeats an identical schema op).

* On-demand snapshots (``txrepl subscriber reinit``, publisher/snapshot.py).
  :meth:`PostgresCapture.export_snapshot` creates a temporary slot with an exported
  snapshot, consistent point ``C``; :meth:`PostgresCapture.wait_position` then
  waits until the capture stream reaches ``C`` (the same crossing as above: a
  ``BEGIN`` of a transaction with commit LSN ``>= C``, or a keepalive at or past
  ``C``, with no transaction open) and returns, per publication, the highest seq
  whose entry's position is ``< C`` (``_last_before``; positions never decrease
  along a log).  Every transaction committed before ``C``
  is in the log at or below that seq, none after it, so the snapshot's rows are
  exactly the state as of that seq.  An install snapshot logged at ``C'`` (entries
  at ``C' - 2``, ``C' - 1``) falls below that seq iff ``C' <= C``: its rows are then
  as old as or older than the snapshot's.

Limits: a table needs a primary key; the primary key and NOT NULL of a schema op are
read from the current catalog; values of types without a txrepl type travel as text.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
import psycopg2
import psycopg2.extensions
import psycopg2.extras
import structlog
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from common.rpc import txrepl_pb2 as pb
from publisher.capture._pgcatalog import Catalog, TableName, TableShape, qident, table_name
from publisher.capture._pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    Datum,
    Delete,
    Event,
    Insert,
    Relation,
    RelColumn,
    Truncate,
    Update,
    parse_pgoutput,
)
from publisher.capture._pgtypes import SESSION_GUCS, to_value
from publisher.capture._pgwal2json import WAL2JSON_OPTIONS, Wal2JsonDecoder
from publisher.errors import SourceError
from publisher.log import Log, LogError
from publisher.publication import Publication

__all__ = ["Plugin", "PostgresCapture"]

log = structlog.get_logger(__name__)

Plugin = Literal["pgoutput", "wal2json"]

_SETUP = """
CREATE SCHEMA IF NOT EXISTS _txrepl;
CREATE TABLE IF NOT EXISTS _txrepl.installs(
    slot text NOT NULL, publication text NOT NULL, tbl text NOT NULL,
    incarnation text NOT NULL, snapshot_lsn numeric(20), done boolean NOT NULL DEFAULT false,
    schema bytea, PRIMARY KEY (slot, publication, tbl));
"""


def _redact(dsn: str) -> str:
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    params.pop("password", None)
    return make_conninfo("", **params)


def _slot_ok(slot: str) -> bool:
    return 0 < len(slot) <= 63 and all(c.islower() or c.isdigit() or c == "_" for c in slot)


@dataclass(slots=True)
class _Table:
    """One installed table of one publication, at run time."""

    name: TableName
    snapshot_lsn: int | None
    complete: bool
    logged: pb.TableSchema | None  # the schema last logged in the publication


@dataclass(slots=True)
class _Pub:
    pub: Publication
    tables: dict[str, _Table] = field(default_factory=dict)  # by display name


@dataclass(slots=True)
class _Rel:
    name: TableName
    rel: Relation
    shape: TableShape | None = None  # resolved on first use


@dataclass(slots=True)
class _Txn:
    final_lsn: int
    commit_time_us: int
    ops: dict[str, list[pb.Op]] = field(default_factory=dict)
    logged: list[tuple[str, str, pb.TableSchema]] = field(default_factory=list)


@dataclass(slots=True)
class _PendingSnapshot:
    lsn: int
    snapshot: str
    conn: Any  # psycopg2 replication connection holding the temporary slot
    tables: dict[str, list[str]]  # publication -> display names


@dataclass(slots=True)
class _Mark:
    lsn: int
    done: threading.Event = field(default_factory=threading.Event)
    heads: dict[str, int] = field(default_factory=dict)


class PostgresCapture:
    """Installs capture on a PostgreSQL source and streams its transactions into logs."""

    def __init__(
        self,
        dsn: str,
        *,
        slot: str,
        plugin: Plugin = "pgoutput",
        snapshot_chunk_rows: int = 10_000,
        feedback_interval_s: float = 0.5,
        lock_timeout_s: float = 30.0,
    ) -> None:
        if not _slot_ok(slot):
            raise SourceError(
                f"slot name {slot!r}: use 1-63 lower-case letters, digits and underscores"
            )
        if plugin not in ("pgoutput", "wal2json"):
            raise SourceError(f"plugin {plugin!r}: choose 'pgoutput' or 'wal2json'")
        self.dsn = dsn
        self.slot = slot
        self.plugin: Plugin = plugin
        self.pg_publication = f"txrepl_{slot}"
        self.snapshot_chunk_rows = snapshot_chunk_rows
        self.feedback_interval_s = feedback_interval_s
        self.lock_timeout_s = lock_timeout_s
        self._lock = threading.Lock()  # guards the admin connection
        self._admin_conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._catalog: Catalog | None = None
        self._setup_done = False
        self._dirty = threading.Event()
        self._marks: list[_Mark] = []  # wait_position requests, resolved by the session
        self._marks_lock = threading.Lock()
        # statistics
        self.transactions = 0
        self.entries = 0
        self.changes = 0

    # -- connections ------------------------------------------------------------

    def _where(self) -> str:
        return f"PostgreSQL source {_redact(self.dsn)}"

    def _admin(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._admin_conn is None or self._admin_conn.closed or self._admin_conn.broken:
            try:
                self._admin_conn = psycopg.connect(self.dsn, autocommit=True, options=SESSION_GUCS)
            except psycopg.OperationalError as e:
                raise SourceError(f"cannot connect to the {self._where()}: {e}") from e
            self._catalog = Catalog(self._admin_conn, self._lock)
        return self._admin_conn

    def _cat(self) -> Catalog:
        self._admin()
        assert self._catalog is not None
        return self._catalog

    def _replication_conn(self) -> Any:
        try:
            conn = psycopg2.connect(
                self.dsn,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                options=SESSION_GUCS,
            )
        except psycopg2.OperationalError as e:
            raise SourceError(
                f"cannot open a replication connection to the {self._where()}: "
                f"{str(e).strip()} (pg_hba.conf needs a `host replication` line for this "
                "user, and the user needs the REPLICATION attribute)"
            ) from e
        return conn

    def close(self) -> None:
        with self._lock:
            if self._admin_conn is not None:
                self._admin_conn.close()
                self._admin_conn = None

    # -- health -----------------------------------------------------------------

    def check(self) -> None:
        """Raise SourceError, saying what to do, if the source cannot be captured."""
        conn = self._admin()
        with self._lock:
            wal_level = conn.execute("SHOW wal_level").fetchone()
            role = conn.execute(
                "SELECT current_user, rolsuper, rolreplication FROM pg_roles"
                " WHERE rolname = current_user"
            ).fetchone()
            slot = conn.execute(
                "SELECT plugin, database, wal_status, current_database()"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (self.slot,),
            ).fetchone()
        if wal_level is None or wal_level[0] != "logical":
            level = wal_level[0] if wal_level else "?"
            raise SourceError(
                f"the {self._where()} has wal_level = {level}; log-based capture needs "
                "wal_level = logical. Run `ALTER SYSTEM SET wal_level = logical` (or set it "
                "in postgresql.conf) and restart PostgreSQL, then start the publisher again."
            )
        if role is None or not (role[1] or role[2]):
            user = role[0] if role else "?"
            raise SourceError(
                f"role {user!r} on the {self._where()} may not stream changes: run "
                f"`ALTER ROLE {qident(str(user))} REPLICATION` as a superuser."
            )
        if slot is not None:
            plugin, database, wal_status, current = slot
            if wal_status == "lost":
                raise SourceError(
                    f"replication slot {self.slot!r} on the {self._where()} is invalidated "
                    "(wal_status = lost): WAL it still needed was removed, so changes were "
                    "lost. Drop it (`SELECT pg_drop_replication_slot('" + self.slot + "')`), "
                    "remove the publications' log directories so they are re-created with "
                    "a new incarnation and a fresh snapshot, and re-initialise subscribers. "
                    "Raise max_slot_wal_keep_size to avoid this."
                )
            if plugin != self.plugin:
                raise SourceError(
                    f"replication slot {self.slot!r} uses plugin {plugin!r}, not "
                    f"{self.plugin!r}: configure plugin = {plugin!r} or choose another slot"
                )
            if database != current:
                raise SourceError(
                    f"replication slot {self.slot!r} belongs to database {database!r}, "
                    f"not {current!r}: choose another slot name"
                )

    def slot_lag_bytes(self) -> int:
        """WAL bytes between the server's current position and the slot's confirmed one."""
        conn = self._admin()
        with self._lock:
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(),"
                " coalesce(confirmed_flush_lsn, restart_lsn))"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (self.slot,),
            ).fetchone()
        if row is None or row[0] is None:
            return 0
        return int(row[0])

    # -- installation -------------------------------------------------------------

    def _setup(self) -> None:
        """Create the state table, the PostgreSQL publication and the slot, once."""
        if self._setup_done:
            return
        self.check()
        conn = self._admin()
        with self._lock:
            try:
                conn.execute(_SETUP)
                if self.plugin == "pgoutput":
                    exists = conn.execute(
                        "SELECT 1 FROM pg_publication WHERE pubname = %s", (self.pg_publication,)
                    ).fetchone()
                    if exists is None:
                        # Created before the slot: pgoutput looks the publication up in
                        # the catalog as of each decoded change.
                        conn.execute(
                            sql.SQL(
                                "CREATE PUBLICATION {} WITH (publish = "
                                "'insert, update, delete, truncate')"
                            ).format(sql.Identifier(self.pg_publication))
                        )
                slot = conn.execute(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
                ).fetchone()
                if slot is None:
                    conn.execute(
                        "SELECT pg_create_logical_replication_slot(%s, %s)",
                        (self.slot, self.plugin),
                    )
                    log.info("replication slot created", slot=self.slot, plugin=self.plugin)
            except psycopg.Error as e:
                raise SourceError(
                    f"cannot set up capture (slot {self.slot!r}, plugin {self.plugin!r}) on "
                    f"the {self._where()}: {str(e).strip()}"
                ) from e
        self._setup_done = True

    def install(self, publication: str, incarnation: str, tables: Sequence[str]) -> list[str]:
        """Make the source capture ``tables`` for ``publication``; returns tables newly added.

        A newly added table (or every table, for a new log incarnation) gets its schema
        and current rows appended by :meth:`run` at the point of the stream where they
        fit; tables no longer listed stop being captured for the publication.
        """
        self._setup()
        names = [table_name(t) for t in tables]
        conn = self._admin()
        added: list[str] = []
        with self._lock:
            existing = {
                str(r[0]): str(r[1])
                for r in conn.execute(
                    "SELECT tbl, incarnation FROM _txrepl.installs"
                    " WHERE slot = %s AND publication = %s",
                    (self.slot, publication),
                )
            }
            for gone in set(existing) - {n.display for n in names}:
                conn.execute(
                    "DELETE FROM _txrepl.installs WHERE slot = %s AND publication = %s"
                    " AND tbl = %s",
                    (self.slot, publication, gone),
                )
            for name in names:
                self._prepare_table(conn, name)
                if existing.get(name.display) == incarnation:
                    continue
                conn.execute(
                    "INSERT INTO _txrepl.installs(slot, publication, tbl, incarnation)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT (slot, publication, tbl) DO UPDATE"
                    " SET incarnation = excluded.incarnation, snapshot_lsn = NULL,"
                    " done = false, schema = NULL",
                    (self.slot, publication, name.display, incarnation),
                )
                added.append(name.display)
            self._drop_unused_locked(conn)
        if added:
            log.info("capture installed", publication=publication, tables=added, slot=self.slot)
        self._dirty.set()
        return added

    def _prepare_table(self, conn: psycopg.Connection[tuple[Any, ...]], name: TableName) -> None:
        """Replica identity FULL and publication membership, with writers waited out."""
        row = conn.execute(
            "SELECT c.relreplident, c.relkind, EXISTS (SELECT 1 FROM pg_index i"
            "  WHERE i.indrelid = c.oid AND i.indisprimary),"
            " EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p"
            "  ON p.oid = pr.prpubid WHERE pr.prrelid = c.oid AND p.pubname = %s)"
            " FROM pg_class c WHERE c.oid = to_regclass(%s)",
            (self.pg_publication, name.sql),
        ).fetchone()
        if row is None:
            raise SourceError(f"table {name.display!r} does not exist in the {self._where()}")
        ident, kind, has_pk, member = row
        if kind not in ("r", "p"):
            raise SourceError(f"{name.display!r} is not a table (relkind {kind!r})")
        if not has_pk:
            raise SourceError(
                f"table {name.display!r} has no PRIMARY KEY; txrepl needs one to replicate "
                "a table (add a primary key, or leave the table out of the publication)"
            )
        need_member = self.plugin == "pgoutput" and not member
        if ident == "f" and not need_member:
            return
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{int(self.lock_timeout_s * 1000)}ms'")
                # SHARE waits for every transaction that wrote the table and keeps new
                # writers out until commit: each write is then either in the snapshot or
                # decoded with the full identity and the publication membership.
                conn.execute(f"LOCK TABLE {name.sql} IN SHARE MODE")
                if ident != "f":
                    conn.execute(f"ALTER TABLE {name.sql} REPLICA IDENTITY FULL")
                if need_member:
                    conn.execute(
                        sql.SQL("ALTER PUBLICATION {} ADD TABLE ONLY {}").format(
                            sql.Identifier(self.pg_publication),
                            sql.Identifier(name.schema, name.name),
                        )
                    )
        except psycopg.errors.LockNotAvailable as e:
            raise SourceError(
                f"could not lock table {name.display!r} within {self.lock_timeout_s:g} s to "
                "add it to capture; a long transaction holds it: retry when it ends"
            ) from e
        except psycopg.errors.InsufficientPrivilege as e:
            raise SourceError(
                f"cannot set up capture of {name.display!r}: {str(e).strip()} (the capture "
                "user must own the table, or be a superuser)"
            ) from e

    def _drop_unused_locked(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        if self.plugin != "pgoutput":
            return
        used = {
            str(r[0])
            for r in conn.execute("SELECT tbl FROM _txrepl.installs WHERE slot = %s", (self.slot,))
        }
        for schema, rel in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
            (self.pg_publication,),
        ).fetchall():
            if TableName(str(schema), str(rel)).display not in used:
                conn.execute(
                    sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                        sql.Identifier(self.pg_publication), sql.Identifier(schema, rel)
                    )
                )

    # -- running ------------------------------------------------------------------

    def run(self, pubs: Sequence[Publication], halt: threading.Event) -> None:
        """Stream committed transactions into ``pubs`` until ``halt`` is set.

        Connection losses are retried with backoff; a source that can no longer be
        captured (slot invalidated, wal_level changed) raises SourceError.
        """
        self._setup()
        backoff = 0.2
        while not halt.is_set():
            session = _Session(self, pubs, halt)
            try:
                session.run()
                return
            except (psycopg2.Error, psycopg.Error) as e:
                self._check_permanent()
                log.warning("capture stream lost; reconnecting", error=str(e).strip())
            finally:
                session.close()
            halt.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _check_permanent(self) -> None:
        """Raise SourceError if the source is reachable but cannot be captured."""
        try:
            self._admin()
        except SourceError:
            return  # unreachable: a restart or a network blip, retried
        try:
            self.check()
        except (psycopg.OperationalError, psycopg.InterfaceError):
            with self._lock:
                if self._admin_conn is not None:
                    self._admin_conn.close()
                    self._admin_conn = None

    # -- helpers used by the session ---------------------------------------------------

    def _load(self, pubs: Sequence[Publication]) -> dict[str, _Pub]:
        conn = self._admin()
        with self._lock:
            rows = conn.execute(
                "SELECT publication, tbl, incarnation, snapshot_lsn, done, schema"
                " FROM _txrepl.installs WHERE slot = %s ORDER BY publication, tbl",
                (self.slot,),
            ).fetchall()
        state = {p.name: _Pub(p) for p in pubs}
        for pubname, tbl, incarnation, snap, done, schema in rows:
            ps = state.get(str(pubname))
            if ps is None:
                continue
            plog = ps.pub.log
            snap_lsn = int(snap) if snap is not None else None
            complete = (
                snap_lsn is not None
                and incarnation == plog.incarnation
                and (
                    ps.pub.position >= snap_lsn - 1
                    # a log purged to empty keeps no position; trust the record then
                    or (bool(done) and 0 < plog.head < plog.first_seq)
                )
            )
            logged = pb.TableSchema.FromString(bytes(schema)) if schema and complete else None
            ps.tables[str(tbl)] = _Table(table_name(str(tbl)), snap_lsn, complete, logged)
        return state

    def _save_logged(self, pub: str, table: str, schema: pb.TableSchema, done: bool) -> None:
        conn = self._admin()
        with self._lock:
            conn.execute(
                "UPDATE _txrepl.installs SET schema = %s, done = done OR %s"
                " WHERE slot = %s AND publication = %s AND tbl = %s",
                (schema.SerializeToString(), done, self.slot, pub, table),
            )

    def _begin_snapshot(self, state: dict[str, _Pub]) -> _PendingSnapshot | None:
        """A temporary slot with an exported snapshot for every incomplete table."""
        want = {
            name: [t for t, tab in ps.tables.items() if not tab.complete]
            for name, ps in state.items()
        }
        want = {k: v for k, v in want.items() if v}
        if not want:
            return None
        pending = self.export_snapshot(tag="snap")
        pending.tables = want
        lsn = pending.lsn
        admin = self._admin()
        try:
            with self._lock, admin.transaction():
                for pubname, tables in want.items():
                    ps = state[pubname]
                    for t in tables:
                        # Recorded before any of the snapshot is logged: see the docstring.
                        admin.execute(
                            "UPDATE _txrepl.installs SET snapshot_lsn = %s, incarnation = %s,"
                            " done = false, schema = NULL"
                            " WHERE slot = %s AND publication = %s AND tbl = %s",
                            (lsn, ps.pub.log.incarnation, self.slot, pubname, t),
                        )
                        ps.tables[t].snapshot_lsn = lsn
        except BaseException:
            pending.conn.close()
            raise
        log.info("snapshot prepared", lsn=_format_lsn(lsn), tables=want)
        return pending

    # -- on-demand snapshots (publisher/snapshot.py) ---------------------------------

    def export_snapshot(self, tag: str = "rsnap") -> _PendingSnapshot:
        """A temporary slot with an exported snapshot; close ``.conn`` when done reading.

        ``tag`` goes into the slot's name: ``snap`` for installs, ``rsnap`` for
        on-demand snapshots.
        """
        conn = self._replication_conn()
        try:
            cur = conn.cursor()
            tmp = f"{self.slot[:40]}_{tag}_{int(time.time() * 1000) % 10**9}"
            cur.execute(
                f"CREATE_REPLICATION_SLOT \"{tmp}\" TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')"
            )
            row = cur.fetchone()
            assert row is not None
            return _PendingSnapshot(_parse_lsn(str(row[1])), str(row[2]), conn, {})
        except BaseException:
            conn.close()
            raise

    def wait_position(self, lsn: int, timeout_s: float) -> dict[str, int]:
        """Per publication, the last seq before ``lsn``, once the stream has reached it."""
        mark = _Mark(lsn)
        with self._marks_lock:
            self._marks.append(mark)
        try:
            if not mark.done.wait(timeout_s):
                raise SourceError(
                    f"capture did not reach the snapshot's position {_format_lsn(lsn)} within"
                    f" {timeout_s:g} s (is capture running? see the publisher's log)"
                )
            return mark.heads
        finally:
            with self._marks_lock:
                if mark in self._marks:
                    self._marks.remove(mark)

    def _first_mark(self) -> int | None:
        with self._marks_lock:
            return min((m.lsn for m in self._marks if not m.done.is_set()), default=None)

    def snapshot_tables(self, publication: str) -> list[TableName]:
        """The installed tables of ``publication``, in install-record order."""
        conn = self._admin()
        with self._lock:
            rows = conn.execute(
                "SELECT tbl FROM _txrepl.installs WHERE slot = %s AND publication = %s"
                " ORDER BY tbl",
                (self.slot, publication),
            ).fetchall()
        return [table_name(str(r[0])) for r in rows]

    def snapshot_shape(
        self, conn: psycopg.Connection[tuple[Any, ...]], table: TableName
    ) -> tuple[TableShape, list[RelColumn]]:
        """A table's shape and columns, read in ``conn``'s (snapshot) transaction."""
        cols = conn.execute(
            "SELECT attname, atttypid, atttypmod FROM pg_attribute"
            " WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped"
            " AND attgenerated = '' ORDER BY attnum",
            (table.sql,),
        ).fetchall()
        if not cols:
            raise SourceError(f"table {table.display!r} is gone from the {self._where()}")
        relcols = [RelColumn(str(n), int(o), int(m)) for n, o, m in cols]
        return self._cat().shape(table, relcols), relcols

    def _read_snapshot(
        self, pending: _PendingSnapshot, table: TableName, keepalive: Callable[[], None]
    ) -> Generator[tuple[TableShape, list[tuple[str | None, ...]]], None, None]:
        """The table's shape, then its rows in chunks, as of the exported snapshot."""
        with psycopg.connect(self.dsn, options=SESSION_GUCS) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            conn.execute(
                sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(pending.snapshot))
            )
            shape, relcols = self.snapshot_shape(conn, table)
            select_list = ", ".join(qident(c.name) for c in relcols)
            chunk: list[tuple[str | None, ...]] = []
            with (
                conn.cursor() as cur,
                cur.copy(f"COPY (SELECT {select_list} FROM ONLY {table.sql}) TO STDOUT") as cp,
            ):
                yield shape, []
                for row in cp.rows():
                    chunk.append(row)
                    if len(chunk) >= self.snapshot_chunk_rows:
                        yield shape, chunk
                        chunk = []
                        keepalive()
            if chunk:
                yield shape, chunk
            conn.rollback()


def _parse_lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


class _Flusher(threading.Thread):
    """Makes a session's appends durable, and visible to feeds, while it decodes on.

    :meth:`kick` after an append; each round flushes every log (a no-op for a log with
    nothing pending), taking along whatever was appended during the previous fsync.
    A failed log stops the flusher with ``error`` set; the session raises it.
    """

    def __init__(self, logs: Sequence[Log]) -> None:
        super().__init__(name="txrepl-pg-capture-flush", daemon=True)
        self.logs = list(logs)
        self.error: LogError | None = None
        self._kicked = threading.Event()
        self._stopping = False

    def kick(self) -> None:
        self._kicked.set()

    def stop(self) -> None:
        self._stopping = True
        self._kicked.set()
        if self.is_alive():
            self.join()

    def run(self) -> None:
        while True:
            self._kicked.wait()
            self._kicked.clear()
            if self._stopping:
                return
            try:
                for lg in self.logs:
                    lg.flush()
            except LogError as e:
                self.error = e
                log.error("capture: publication log flush failed", error=str(e))
                return


class _Session:
    """One replication connection's worth of streaming (reconnects make a new one)."""

    def __init__(
        self, cap: PostgresCapture, pubs: Sequence[Publication], halt: threading.Event
    ) -> None:
        self.cap = cap
        self.halt = halt
        self.pubs = pubs
        self.state: dict[str, _Pub] = {}
        self.routes: dict[str, list[tuple[_Pub, _Table]]] = {}
        self.rels: dict[int, _Rel] = {}
        self.prev_shapes: dict[int, TableShape] = {}
        self.txn: _Txn | None = None
        self.pending: _PendingSnapshot | None = None
        self.conn: Any = None
        self.cur: Any = None
        self.confirmable = 0  # end LSN of the last transaction handled (logged or not)
        self.confirmed = 0
        self.touched: set[str] = set()
        self.last_feedback = 0.0
        self.wal2json = Wal2JsonDecoder() if cap.plugin == "wal2json" else None
        self.flusher = _Flusher([p.log for p in pubs])

    def close(self) -> None:
        self.flusher.stop()
        if self.pending is not None:
            self.pending.conn.close()
            self.pending = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _reload(self) -> None:
        self.cap._dirty.clear()
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
        if self.pending is None:
            self.pending = self.cap._begin_snapshot(self.state)

    def run(self) -> None:
        cap = self.cap
        self._reload()
        self.conn = cap._replication_conn()
        self.cur = self.conn.cursor()
        options = (
            {"proto_version": "1", "publication_names": cap.pg_publication}
            if cap.plugin == "pgoutput"
            else dict(WAL2JSON_OPTIONS)
        )
        self.cur.start_replication(
            slot_name=cap.slot, decode=False, options=options, status_interval=5
        )
        log.info("capture streaming", slot=cap.slot, plugin=cap.plugin)
        self.flusher.start()
        fd = self.conn.fileno()
        while not self.halt.is_set():
            if self.flusher.error is not None:
                raise self.flusher.error
            if cap._dirty.is_set() and self.txn is None:
                self._reload()
            msg = self.cur.read_message()
            if msg is not None:
                self._handle(msg.payload)
                if self.txn is None:
                    self._feedback()
                continue
            self._idle()
            select.select([fd], [], [], 0.2)
        if self.txn is None:
            self._feedback(force=True)

    # -- stream events ---------------------------------------------------------------

    def _events(self, payload: bytes) -> Iterable[Event]:
        if self.wal2json is not None:
            return self.wal2json.decode(payload)
        ev = parse_pgoutput(payload)
        return () if ev is None else (ev,)

    def _handle(self, payload: bytes) -> None:
        for ev in self._events(payload):
            if isinstance(ev, Begin):
                self._cross(ev.final_lsn)
                self.txn = _Txn(ev.final_lsn, ev.commit_time_us)
            elif isinstance(ev, Commit):
                self._commit(ev)
            elif isinstance(ev, Relation):
                prev = self.rels.get(ev.oid)
                if prev is not None and prev.shape is not None:
                    # its key stands in if the table is gone from the catalog by now
                    self.prev_shapes[ev.oid] = prev.shape
                self.rels[ev.oid] = _Rel(TableName(ev.namespace, ev.name), ev)
            elif isinstance(ev, Insert | Update | Delete):
                self._change(ev)
            elif isinstance(ev, Truncate):
                self._truncate(ev)

    def _targets(self, table: str) -> list[tuple[_Pub, _Table]]:
        txn = self.txn
        assert txn is not None
        return [
            (ps, tab)
            for ps, tab in self.routes.get(table, ())
            if tab.complete and txn.final_lsn > ps.pub.position
        ]

    def _shape(self, r: _Rel) -> TableShape:
        if r.shape is None:
            r.shape = self.cap._cat().shape(r.name, r.rel.columns, self.prev_shapes.get(r.rel.oid))
        return r.shape

    def _ops(self, ps: _Pub, tab: _Table, shape: TableShape) -> list[pb.Op]:
        txn = self.txn
        assert txn is not None
        ops = txn.ops.setdefault(ps.pub.name, [])
        if tab.logged != shape.schema:
            ops.append(pb.Op(schema=shape.schema))
            tab.logged = shape.schema
            txn.logged.append((ps.pub.name, shape.schema.table, shape.schema))
        return ops

    def _change(self, ev: Insert | Update | Delete) -> None:
        r = self.rels.get(ev.oid)
        if r is None:
            raise SourceError(f"change for relation {ev.oid} before its relation message")
        targets = self._targets(r.name.display)
        if not targets:
            return
        shape = self._shape(r)
        infos = shape.infos
        rc = pb.RowChange(table=r.name.display)
        if isinstance(ev, Insert):
            rc.op = pb.ROW_OP_INSERT
            rc.row.extend(to_value(_text(d), i) for d, i in zip(ev.new, infos, strict=True))
        elif isinstance(ev, Update):
            rc.op = pb.ROW_OP_UPDATE
            new = ev.new
            if UNCHANGED in new:
                new = self._fill_unchanged(r, new, ev.old)
            key_src = ev.old if ev.old is not None else new
            rc.key.extend(to_value(_text(key_src[k]), infos[k]) for k in shape.key_idx)
            rc.row.extend(to_value(_text(d), i) for d, i in zip(new, infos, strict=True))
        else:
            rc.op = pb.ROW_OP_DELETE
            rc.key.extend(to_value(_text(ev.old[k]), infos[k]) for k in shape.key_idx)
        self.cap.changes += 1
        for ps, tab in targets:
            self._ops(ps, tab, shape).append(pb.Op(row=rc))

    def _fill_unchanged(
        self, r: _Rel, new: tuple[Datum, ...], old: tuple[Datum, ...] | None
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
            for ps, _tab in self._targets(r.name.display):
                # no schema op needed: the table's next row brings one if it changed
                ops = txn.ops.setdefault(ps.pub.name, [])
                ops.append(pb.Op(row=pb.RowChange(table=r.name.display, op=pb.ROW_OP_TRUNCATE)))

    def _commit(self, ev: Commit) -> None:
        txn = self.txn
        if txn is None:
            raise SourceError("commit without a transaction in the stream")
        self.txn = None
        for pubname, ops in txn.ops.items():
            if not ops:
                continue
            ps = self.state[pubname]
            entry = pb.Entry(commit_time_us=ev.commit_time_us)
            entry.ops.extend(ops)
            ps.pub.append(entry, position=ev.commit_lsn, wait=False)
            self.touched.add(pubname)
            self.cap.entries += 1
        self.flusher.kick()
        for pubname, table, schema in txn.logged:
            self.state[pubname].pub.log.flush()  # the schema op is durable before it is saved
            self.cap._save_logged(pubname, table, schema, done=False)
        self.cap.transactions += 1
        self.confirmable = max(self.confirmable, ev.end_lsn)

    # -- snapshot crossing, feedback ------------------------------------------------

    def _mark(self, lsn: int) -> None:
        """Resolve the wait_position requests at or below ``lsn`` (no transaction open)."""
        cap = self.cap
        with cap._marks_lock:
            due = [m for m in cap._marks if m.lsn <= lsn and not m.done.is_set()]
        if not due:
            return
        for ps in self.state.values():
            ps.pub.log.flush()  # the seqs handed out are durable
        for m in due:
            m.heads = {name: _last_before(ps.pub, m.lsn) for name, ps in self.state.items()}
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
                last_table = i == len(tables) - 1
                self._log_snapshot(ps, ps.tables[t], pending, last_table)
        pending.conn.close()
        self.pending = None
        log.info("snapshots logged", lsn=_format_lsn(pending.lsn), tables=pending.tables)
        # tables installed while this snapshot was pending get the next one
        self.pending = self.cap._begin_snapshot(self.state)
        self._mark(lsn)

    def _log_snapshot(
        self, ps: _Pub, tab: _Table, pending: _PendingSnapshot, last_table: bool
    ) -> None:
        """Append schema, TRUNCATE and rows; the last entry of the last table at C - 1."""
        pub = ps.pub
        display = tab.name.display
        rows = 0
        chunks = self.cap._read_snapshot(pending, tab.name, self._keepalive)
        with contextlib.closing(chunks) as it:
            shape, _ = next(it)
            entry = pb.Entry(commit_time_us=int(time.time() * 1_000_000))
            entry.ops.append(pb.Op(schema=shape.schema))
            entry.ops.append(pb.Op(row=pb.RowChange(table=display, op=pb.ROW_OP_TRUNCATE)))
            for _, chunk in it:
                for row in chunk:
                    if len(entry.ops) >= self.cap.snapshot_chunk_rows:
                        # not the last entry: a crash now leaves the snapshot incomplete
                        pub.append(entry, position=pending.lsn - 2)
                        self.cap.entries += 1
                        entry = pb.Entry(commit_time_us=int(time.time() * 1_000_000))
                    rc = pb.RowChange(table=display, op=pb.ROW_OP_INSERT)
                    rc.row.extend(to_value(d, i) for d, i in zip(row, shape.infos, strict=True))
                    entry.ops.append(pb.Op(row=rc))
                rows += len(chunk)
        pub.append(entry, position=pending.lsn - 1 if last_table else pending.lsn - 2)
        self.cap.entries += 1
        tab.complete = True
        tab.logged = shape.schema
        self.touched.add(pub.name)
        self.cap._save_logged(pub.name, display, shape.schema, done=True)
        log.info("table snapshot logged", publication=pub.name, table=display, rows=rows)

    def _keepalive(self) -> None:
        if self.cur is not None:
            self.cur.send_feedback()

    def _idle(self) -> None:
        if self.txn is not None:
            return
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

    def _feedback(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.confirmable <= self.confirmed:
            return
        if not force and now - self.last_feedback < self.cap.feedback_interval_s:
            return
        for name in self.touched:
            self.state[name].pub.log.flush()  # durable before the slot moves past it
        self.touched.clear()
        self.cur.send_feedback(flush_lsn=self.confirmable, write_lsn=self.confirmable)
        self.confirmed = self.confirmable
        self.last_feedback = now


def _last_before(pub: Publication, lsn: int) -> int:
    """The highest seq whose entry's source position is below ``lsn``.

    Positions never decrease along a log (commit LSNs in commit order; an install
    snapshot's ``C - 2``/``C - 1`` sit between the commits before and after ``C``;
    a ``Publish`` entry repeats the current position), so this walks back from the
    head over the entries appended since the stream passed ``lsn`` (usually none).
    """
    log_ = pub.log
    seq = log_.head
    while seq >= max(1, log_.first_seq):
        (payload,) = log_.read(seq, max_entries=1)
        if int(pb.Entry.FromString(payload).source_position or 0) < lsn:
            break
        seq -= 1
    return seq


def _text(d: Datum) -> str | None:
    if d is UNCHANGED:
        raise SourceError("unchanged TOAST value where a full value is needed")
    return d  # type: ignore[return-value]
