"""The PostgreSQL capture's core: connections, health, installation, snapshots.

:class:`CaptureCore` holds everything but the streaming loop: the admin
connection and the catalog, ``check()`` (wal_level, REPLICATION, slot health),
``install()`` (``_install.py``), the install-snapshot bookkeeping the session
calls (``_load``, ``_save_logged``, ``_begin_snapshot``), exported snapshots
(``export_snapshot``, ``wait_position``, ``_read_snapshot``).  Ordering: __init__.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal

import psycopg
import psycopg2
import psycopg2.extras
import structlog
from psycopg import sql

from common.rpc import txrepl_pb2 as pb
from publisher.capture.health import CaptureHealth
from publisher.capture.postgres._ddlwatch import relcols
from publisher.capture.postgres._install import Installer
from publisher.capture.postgres._partitions import (
    select_from,
)
from publisher.capture.postgres._pgcatalog import (
    Catalog,
    TableName,
    TableShape,
    qident,
    table_name,
)
from publisher.capture.postgres._pgoutput import RelColumn
from publisher.capture.postgres._pgtypes import SESSION_GUCS
from publisher.capture.postgres._stale import check_fresh
from publisher.capture.postgres._state import (
    Mark,
    PendingSnapshot,
    PubState,
    TableState,
    format_lsn,
    parse_lsn,
    redact,
    slot_ok,
)
from publisher.errors import RowTooLarge, SourceError
from publisher.publication import Publication

__all__ = ["CaptureCore", "Plugin"]

log = structlog.get_logger(__name__)

Plugin = Literal["pgoutput", "wal2json"]


class CaptureCore(Installer):
    """Installs capture on a PostgreSQL source; the base of :class:`PostgresCapture`."""

    def __init__(
        self,
        dsn: str,
        *,
        slot: str,
        plugin: Plugin = "pgoutput",
        snapshot_chunk_rows: int = 10_000,
        feedback_interval_s: float = 0.5,
        lock_timeout_s: float = 30.0,
        max_entry_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        if not slot_ok(slot):
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
        self.max_entry_bytes = max_entry_bytes  # a larger transaction: fragments (_session.py)
        self.refused: dict[str, RowTooLarge] = {}  # publications stopped on a row too large
        self._lock = threading.Lock()  # guards the admin connection
        self._admin_conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._catalog: Catalog | None = None
        self._setup_done = False
        self._dirty = threading.Event()
        self._marks: list[Mark] = []  # wait_position requests, resolved by the session
        self._marks_lock = threading.Lock()
        self.health = CaptureHealth(self.refused)  # the streaming loop reports into it
        # statistics
        self.transactions = 0
        self.entries = 0
        self.changes = 0

    # -- connections ------------------------------------------------------------

    def _where(self) -> str:
        return f"PostgreSQL source {redact(self.dsn)}"

    def _admin(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._admin_conn is None or self._admin_conn.closed or self._admin_conn.broken:
            try:
                self._admin_conn = psycopg.connect(
                    self.dsn, autocommit=True, options=SESSION_GUCS, connect_timeout=10
                )  # bounded: a metrics scrape reads the slot lag through it
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

    def slot_lag(self) -> tuple[int, float]:
        """The slot's lag: WAL bytes between the server's current position and the
        slot's confirmed one, and seconds (the walsender's flush lag while capture
        streams; else since capture last streamed; 0 when no byte lags)."""
        conn = self._admin()
        with self._lock:
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(),"
                " coalesce(s.confirmed_flush_lsn, s.restart_lsn)), s.active,"
                " extract(epoch FROM r.flush_lag)"
                " FROM pg_replication_slots s LEFT JOIN pg_stat_replication r"
                " ON r.pid = s.active_pid WHERE s.slot_name = %s",
                (self.slot,),
            ).fetchone()
        if row is None or row[0] is None:
            return 0, 0.0
        lag, active, flush_lag = int(row[0]), bool(row[1]), row[2]
        if lag <= 0:
            return 0, 0.0
        if active:
            return lag, float(flush_lag or 0.0)
        return lag, max(0.0, time.time() - self.health.last_ok)

    # -- helpers used by the session ---------------------------------------------------

    def _load(self, pubs: Sequence[Publication]) -> dict[str, PubState]:
        conn = self._admin()
        with self._lock:
            rows = conn.execute(
                "SELECT publication, tbl, incarnation, snapshot_lsn, done, schema"
                " FROM _txrepl.installs WHERE slot = %s ORDER BY publication, tbl",
                (self.slot,),
            ).fetchall()
        state = {p.name: PubState(p) for p in pubs}
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
            ps.tables[str(tbl)] = TableState(table_name(str(tbl)), snap_lsn, complete, logged)
        return state

    def _save_logged(self, pub: str, table: str, schema: pb.TableSchema, done: bool) -> None:
        conn = self._admin()
        with self._lock:
            conn.execute(
                "UPDATE _txrepl.installs SET schema = %s, done = done OR %s"
                " WHERE slot = %s AND publication = %s AND tbl = %s",
                (schema.SerializeToString(), done, self.slot, pub, table),
            )

    def _begin_snapshot(self, state: dict[str, PubState]) -> PendingSnapshot | None:
        """A temporary slot with an exported snapshot for every incomplete table."""
        want = {
            name: [t for t, tab in ps.tables.items() if not tab.complete or tab.recopy]
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
        log.info("snapshot prepared", lsn=format_lsn(lsn), tables=want)
        return pending

    # -- on-demand snapshots (publisher/snapshot.py) ---------------------------------

    def export_snapshot(self, tag: str = "rsnap") -> PendingSnapshot:
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
            return PendingSnapshot(parse_lsn(str(row[1])), str(row[2]), conn, {})
        except BaseException:
            conn.close()
            raise

    def wait_position(self, lsn: int, timeout_s: float) -> dict[str, int]:
        """Per publication, the last seq before ``lsn``, once the stream has reached it."""
        mark = Mark(lsn)
        with self._marks_lock:
            self._marks.append(mark)
        try:
            if not mark.done.wait(timeout_s):
                raise SourceError(
                    f"capture did not reach the snapshot's position {format_lsn(lsn)} within"
                    f" {timeout_s:g} s (is capture running? see the publisher's log)"
                )
            return mark.heads
        finally:
            with self._marks_lock:
                if mark in self._marks:
                    self._marks.remove(mark)

    def _first_mark(self) -> int | None:
        if not self._marks:
            return None  # none asked: no lock at every idle moment
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
        cols = relcols(conn, table.sql)
        if not cols:
            raise SourceError(f"table {table.display!r} is gone from the {self._where()}")
        return self._cat().shape(table, cols), cols

    def current_shape(self, table: TableName) -> TableShape:
        """The table's shape in the current catalog (``_ddlwatch``)."""
        conn = self._admin()
        with self._lock:
            cols = relcols(conn, table.sql)
        if not cols:
            raise SourceError(f"table {table.display!r} is gone from the {self._where()}")
        return self._cat().shape(table, cols)

    def _read_snapshot(
        self, pending: PendingSnapshot, table: TableName, keepalive: Callable[[], None]
    ) -> Generator[tuple[TableShape, list[tuple[str | None, ...]]], None, None]:
        """The table's shape, then its rows in chunks, as of the exported snapshot."""
        with psycopg.connect(self.dsn, options=SESSION_GUCS) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            conn.execute(
                sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(pending.snapshot))
            )
            shape, relcols = self.snapshot_shape(conn, table)
            check_fresh(conn, table)  # a rewrite since the snapshot reads as empty
            select_list = ", ".join(qident(c.name) for c in relcols)
            chunk: list[tuple[str | None, ...]] = []
            with (
                conn.cursor() as cur,
                cur.copy(
                    f"COPY (SELECT {select_list} FROM {select_from(conn, table.sql)}) TO STDOUT"
                ) as cp,
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
