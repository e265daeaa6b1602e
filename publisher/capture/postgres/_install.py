"""Installing capture on a PostgreSQL source: the slot, the publication, each table.

:class:`Installer` is the half of :class:`~publisher.capture.postgres.CaptureCore`
that makes the source capture a publication's tables (``install``), and sets up
once what every publication shares (``_setup``): the ``_txrepl.installs`` table,
the PostgreSQL publication ``txrepl_<slot>`` (pgoutput: created before the slot,
since pgoutput reads it from the catalog as of each decoded change; partitions
published via their root) and the logical replication slot.

Installing checks every table before it changes anything: a table that is
missing, has no primary key, is partitioned under wal2json or has a column whose
type cannot be carried exactly is refused by name (``TableRefused``, the others
served), and the capture stays as it was.  Then each table gets replica identity
FULL and membership in the publication under a ``SHARE`` lock, which waits for
every transaction that wrote it and keeps new writers out until commit: each
write is either in the install snapshot or decoded with the full identity.  Its
``_txrepl.installs`` row (reset for a new log incarnation) makes the session
append the table's schema and rows where they fit in the stream (__init__.py,
"Ordering"); tables no longer listed leave the publication.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg
import structlog
from psycopg import sql

from publisher.capture.postgres._partitions import leaves_identity, publication_members, via_root
from publisher.capture.postgres._pgcatalog import (
    TableName,
    UnsupportedType,
    pg_target_type,
    table_name,
)
from publisher.capture.postgres._pgwal2json import LOSSY_TYPES
from publisher.errors import SourceError, TableRefused

__all__ = ["Installer"]

log = structlog.get_logger(__name__)

_SETUP = """
CREATE SCHEMA IF NOT EXISTS _txrepl;
CREATE TABLE IF NOT EXISTS _txrepl.installs(
    slot text NOT NULL, publication text NOT NULL, tbl text NOT NULL,
    incarnation text NOT NULL, snapshot_lsn numeric(20), done boolean NOT NULL DEFAULT false,
    schema bytea, PRIMARY KEY (slot, publication, tbl));
"""


class Installer:
    """``_setup`` and ``install``; the connections and ``check`` are the core's."""

    slot: str
    plugin: str
    pg_publication: str
    lock_timeout_s: float
    _lock: threading.Lock  # guards the admin connection
    _setup_done: bool
    _dirty: threading.Event

    def _admin(self) -> psycopg.Connection[tuple[Any, ...]]:
        raise NotImplementedError

    def _where(self) -> str:
        raise NotImplementedError

    def check(self) -> None:
        raise NotImplementedError

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
