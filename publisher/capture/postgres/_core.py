"""The PostgreSQL capture's core: connections, health, installation, snapshots.

:class:`CaptureCore` holds everything but the streaming loop: the admin
connection and the catalog, ``check()`` (wal_level, REPLICATION, slot health),
``install()`` (replica identity FULL, membership in the PostgreSQL publication,
the ``_txrepl.installs`` rows), the install-snapshot bookkeeping the session
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
from publisher.capture.postgres._partitions import (
    leaves_identity,
    publication_members,
    select_from,
    via_root,
)
from publisher.capture.postgres._pgcatalog import (
    Catalog,
    TableName,
    TableShape,
    UnsupportedType,
    pg_target_type,
    qident,
    table_name,
)
from publisher.capture.postgres._pgoutput import RelColumn
from publisher.capture.postgres._pgtypes import SESSION_GUCS
from publisher.capture.postgres._pgwal2json import LOSSY_TYPES
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
from publisher.errors import RowTooLarge, SourceError, TableRefused
from publisher.publication import Publication

__all__ = ["CaptureCore", "Plugin"]

log = structlog.get_logger(__name__)

Plugin = Literal["pgoutput", "wal2json"]

_SETUP = """
CREATE SCHEMA IF NOT EXISTS _txrepl;
CREATE TABLE IF NOT EXISTS _txrepl.installs(
    slot text NOT NULL, publication text NOT NULL, tbl text NOT NULL,
    incarnation text NOT NULL, snapshot_lsn numeric(20), done boolean NOT NULL DEFAULT false,
    schema bytea, PRIMARY KEY (slot, publication, tbl));
"""


class CaptureCore:
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
                                "'insert, update, delete, truncate',"
                                " publish_via_partition_root = true)"
                            ).format(sql.Identifier(self.pg_publication))
                        )
                    via_root(conn, self.pg_publication)  # one made before (_partitions.py)
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
            # Every table is checked before anything changes: a refused one (missing, no
            # primary key, a type that cannot be carried) leaves the capture as it was.
            vetted = [(name, *self._vet_table(conn, name)) for name in names]
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
            for name, ident, member in vetted:
                self._prepare_table(conn, name, ident, member)
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

    def _vet_table(
        self, conn: psycopg.Connection[tuple[Any, ...]], name: TableName
    ) -> tuple[str, bool]:
        """Refuse, by name, a table capture cannot replicate; (replica identity, member)."""
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
        if kind == "p" and self.plugin != "pgoutput":
            raise TableRefused(
                f"table {name.display!r} is partitioned: {self.plugin} names its partitions,"
                ' not the table; capture it with plugin = "pgoutput"',
                table=name.display,
            )
        if kind == "p":  # FULL only if every partition has it too
            ident, _ = leaves_identity(conn, name.sql)
        if not has_pk:
            raise TableRefused(
                f"table {name.display!r} has no PRIMARY KEY; txrepl needs one to replicate "
                "a table (add a primary key, or leave the table out of the publication)",
                table=name.display,
            )
        self._check_types(conn, name)
        return str(ident), bool(member)

    def _prepare_table(
        self, conn: psycopg.Connection[tuple[Any, ...]], name: TableName, ident: str, member: bool
    ) -> None:
        """Replica identity FULL and publication membership, with writers waited out."""
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
                if ident != "f":  # and each partition's: they decode the changes
                    for rel in [name.sql, *leaves_identity(conn, name.sql)[1]]:
                        conn.execute(f"ALTER TABLE {rel} REPLICA IDENTITY FULL")
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

    def _check_types(self, conn: psycopg.Connection[tuple[Any, ...]], name: TableName) -> None:
        """Refuse a table with a column whose type cannot be carried exactly, by name."""
        columns = conn.execute(
            "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid ="
            " to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (name.sql,),
        ).fetchall()
        for column, oid, typmod in columns:
            try:
                spelled, _ = pg_target_type(conn, int(oid), int(typmod))
                if self.plugin == "wal2json" and spelled.split("(")[0] in LOSSY_TYPES:
                    raise UnsupportedType(
                        spelled,
                        "wal2json writes its NaN and Infinity values as null (use plugin = "
                        "'pgoutput')",
                    )
            except UnsupportedType as e:
                raise TableRefused(
                    f"table {name.display!r}, column {column!r}: {e}; leave the table out of "
                    "the publication or change the column's type",
                    table=name.display,
                ) from e

    def _drop_unused_locked(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        if self.plugin != "pgoutput":
            return
        used = {
            str(r[0])
            for r in conn.execute("SELECT tbl FROM _txrepl.installs WHERE slot = %s", (self.slot,))
        }
        for schema, rel in publication_members(conn, self.pg_publication):
            if TableName(str(schema), str(rel)).display not in used:
                conn.execute(
                    sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                        sql.Identifier(self.pg_publication), sql.Identifier(schema, rel)
                    )
                )

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
