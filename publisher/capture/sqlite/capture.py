"""Trigger-based capture from a SQLite source (the embedded default).

How it works
============
Everything that reaches a publication's log passes through ONE capture table in
the source database, written by triggers in the writer's own transaction::

    _txrepl_capture(id INTEGER PRIMARY KEY AUTOINCREMENT,
                    pub TEXT,        -- NULL: every publication holding tbl;
                                     -- else only this publication (snapshots)
                    tbl TEXT, op TEXT,   -- 'I' 'U' 'D' row changes, 'S' schema,
                                         -- 'T' truncate, 'C' 'E' call marks
                    k, v,            -- k: old primary key, v: new row, each a
                                     -- packed image (shapes.py; images.py reads
                                     -- it); for 'S', v is a serialized
                                     -- txrepl.v1.TableSchema
                    gen)             -- the shape k and v are in (_txrepl_shapes)
    _txrepl_pubs(publication, incarnation, tbl, added_id)   -- what is installed
    _txrepl_shapes(gen, tbl, schema)  -- each build of a table's triggers

``shapes.py``: the triggers and schema evolution; ``constraints.py``: indexes;
``entries.py``: captured rows into the entries of a publication (the rules there).

* Order.  SQLite serialises writers, so AUTOINCREMENT ids are handed out in commit
  order.  A reader sees only whole committed transactions, so one poll (one read
  transaction) yields whole transactions in commit order; they become one entry
  per publication (group commit).  SQLite gives triggers no transaction id, so
  an entry may hold several consecutive transactions, never part of one.
* Exact values.  The packed image carries text and blobs as their stored bytes
  (a NUL included) and integers and reals as quote() renders them (enough digits
  to round-trip, unlike json_array's 15-digit reals); TEXT that is not UTF-8 is
  read with surrogate escapes and carried as ``text_bytes``.  Values keep their
  storage class (``exact.py``): docs/types.md.
* Adding a table to a publication is ONE source write transaction (BEGIN
  IMMEDIATE): (re)create the triggers, append an 'S' row carrying the table's
  schema, copy every existing row as an 'I' row tagged with the publication, and
  record ``added_id`` (the 'S' row's id).  Rows of ``tbl`` with an id below
  ``added_id`` are not for that publication.  Nothing is missed or doubled: the
  triggers and the copy commit together, in the same serial order as every writer.
* Exactly once.  Each entry records the highest capture id it holds as its
  ``source_position``.  The capture rows are deleted only after the entry is
  durable in every publication log that needs them; on restart each publication
  resumes after the position of its log's last entry.  A crash between append
  and delete therefore neither loses nor duplicates anything.
* The incarnation of the publication's log is recorded with the installation: a
  re-created log (new incarnation) gets a fresh schema + snapshot.

Limits (documented in the README): a table needs a primary key.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import structlog

from common.constraints import same_shape
from common.origin import ensure_applying
from common.rpc import txrepl_pb2 as pb
from common.values import parse_declared_type, sqlite_text_factory
from publisher.capture.health import CaptureHealth
from publisher.capture.sqlite.constraints import read_constraints
from publisher.capture.sqlite.entries import CapturedRow, EntryBuilder, Shape
from publisher.capture.sqlite.images import parse_sql_literal
from publisher.capture.sqlite.locks import WAIT_SLICE_S, delete_released, waiting
from publisher.capture.sqlite.mapping import sqlite_pg_type
from publisher.capture.sqlite.shapes import (
    TRIGGER_TAGS,
    build_triggers,
    carry_origin,
    copy_rows,
    fallback_name,
    qident,
    trigger_name,
)
from publisher.errors import SourceError

__all__ = ["CHUNK_ROWS", "CapturedRow", "SqliteCapture", "parse_sql_literal", "qident"]

# Rows read at once when reading in chunks: narrow rows cost far more as Python
# objects (about 400 bytes each) than their stored bytes, which max_bytes counts.
CHUNK_ROWS = 20_000

log = structlog.get_logger(__name__)

_SETUP = """
CREATE TABLE IF NOT EXISTS _txrepl_capture(
    id INTEGER PRIMARY KEY AUTOINCREMENT, pub TEXT, tbl TEXT NOT NULL,
    op TEXT NOT NULL, k, v);
CREATE TABLE IF NOT EXISTS _txrepl_pubs(
    publication TEXT NOT NULL, incarnation TEXT NOT NULL, tbl TEXT NOT NULL,
    added_id INTEGER NOT NULL, PRIMARY KEY (publication, tbl));
CREATE TABLE IF NOT EXISTS _txrepl_shapes(
    gen INTEGER PRIMARY KEY AUTOINCREMENT, tbl TEXT NOT NULL, schema BLOB NOT NULL);
"""


class SqliteCapture(EntryBuilder):
    """Installs capture on a SQLite source and turns captured rows into entries."""

    def __init__(
        self, path: Path, *, busy_timeout_s: float = 30.0, health: CaptureHealth | None = None
    ) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self.health = health if health is not None else CaptureHealth()
        # retries while locked (publisher/capture/sqlite/locks.py), counting the waits
        self._waiting = partial(waiting, path=path, health=self.health, timeout_s=busy_timeout_s)
        if not path.exists():
            raise SourceError(f"SQLite source {path} does not exist")
        self._conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=WAIT_SLICE_S
        )
        self._conn.text_factory = sqlite_text_factory  # TEXT that is not UTF-8 too
        self._conn.execute(f"PRAGMA busy_timeout = {int(WAIT_SLICE_S * 1000)}")
        self._conn.executescript(_SETUP)
        have = {r[1] for r in self._conn.execute("PRAGMA table_info(_txrepl_capture)")}
        for col, decl in (("gen", "INTEGER"), ("origin", "TEXT")):  # an earlier build's table
            if col not in have:
                self._conn.execute(f"ALTER TABLE _txrepl_capture ADD COLUMN {col} {decl}")
        ensure_applying(self._conn)  # the triggers read the apply's origin (common/origin.py)
        # gen -> (schema, value types, key types); None: the current schema (old rows)
        self._shapes: dict[int | None, Shape] = {}
        # (publication, table) -> the generation whose schema op the log has last seen
        self._logged: dict[tuple[str, str], int | None] = {}
        self._data_version = -1
        self._schema_version = -1  # as of the last refresh

    def close(self) -> None:
        self._conn.close()

    # -- schema -----------------------------------------------------------------

    def read_schema(self, table: str, conn: sqlite3.Connection | None = None) -> pb.TableSchema:
        """The table's schema now (or as ``conn``'s open read transaction sees it)."""
        rows = (conn or self._conn).execute(f"PRAGMA table_xinfo({qident(table)})").fetchall()
        if not rows:
            raise SourceError(f"table {table!r} does not exist in the SQLite source {self.path}")
        schema = pb.TableSchema(table=table, source_dialect="sqlite")
        pk: list[tuple[int, str]] = []
        for _cid, name, decl, notnull, _default, pkpos, hidden in rows:
            if hidden:  # generated columns are computed again on the target
                continue
            ctype, prec, scale = parse_declared_type(decl or "")
            schema.columns.add(
                name=name,
                type=ctype,
                precision=prec,
                scale=scale,
                nullable=not notnull and not pkpos,
                source_type=decl or "",
                pg_type=sqlite_pg_type(ctype, prec, scale),
            )
            if pkpos:
                pk.append((pkpos, name))
        if not pk:
            raise SourceError(
                f"table {table!r} in {self.path} has no PRIMARY KEY; txrepl needs one to "
                "replicate a table (add a primary key, or leave the table out of the publication)"
            )
        schema.primary_key.extend(name for _, name in sorted(pk))
        schema.constraints.extend(read_constraints(conn or self._conn, table))
        return schema

    def _shape(self, gen: int | None, table: str) -> Shape:
        """The shape of generation ``gen`` (None: the table's current schema)."""
        if gen is None:
            return Shape.of(self.read_schema(table))
        shape = self._shapes.get(gen)
        if shape is None:
            row = self._conn.execute(
                "SELECT schema FROM _txrepl_shapes WHERE gen = ?", (gen,)
            ).fetchone()
            if row is None:
                raise SourceError(f"capture row of {table!r} names unknown generation {gen}")
            shape = self._shapes[gen] = Shape.of(pb.TableSchema.FromString(row[0]))
        return shape

    def _latest(self, table: str) -> tuple[int, pb.TableSchema] | None:
        row = self._conn.execute(
            "SELECT gen, schema FROM _txrepl_shapes WHERE tbl = ? ORDER BY gen DESC LIMIT 1",
            (table,),
        ).fetchone()
        return None if row is None else (int(row[0]), pb.TableSchema.FromString(row[1]))

    def _triggers_present(self, table: str) -> tuple[bool, bool]:
        """(all three triggers exist, one writes the JSON images of older builds)."""
        names = [trigger_name(tag, table) for tag in TRIGGER_TAGS]
        sqls = [
            str(r[0])
            for r in self._conn.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? "
                "AND name IN (?, ?, ?)",
                (table, *names),
            )
        ]
        return len(sqls) == len(names), any("json_array(" in sql for sql in sqls)

    def _refresh_table(self, table: str, *, log_change: bool) -> int:
        """Steps 1-4 of shapes.py for one table, inside the caller's write transaction.

        Returns the table's current generation.  ``log_change`` False: only build
        (the caller logs the schema and rows itself, as installation does).
        """
        schema = self.read_schema(table)
        latest = self._latest(table)
        present, json_images = self._triggers_present(table)
        if latest is not None and present and latest[1] == schema:
            # an earlier build's triggers, same shape: rebuilt with the origin
            # (common/origin.py) and packed images (shapes.py)
            if json_images or not carry_origin(self._conn, table):
                build_triggers(self._conn, schema, latest[0])
            return latest[0]
        cur = self._conn.execute(
            "INSERT INTO _txrepl_shapes(tbl, schema) VALUES (?, ?)",
            (table, schema.SerializeToString()),
        )
        gen = int(cur.lastrowid or 0)
        build_triggers(self._conn, schema, gen)
        if latest is not None and log_change:
            self._conn.execute(
                "INSERT INTO _txrepl_capture(pub, tbl, op, v, gen) VALUES (NULL, ?, 'S', ?, ?)",
                (table, schema.SerializeToString(), gen),
            )
            if not present:  # rebuilt: changes since the old table was dropped are lost
                self._conn.execute(
                    "INSERT INTO _txrepl_capture(pub, tbl, op, gen) VALUES (NULL, ?, 'T', ?)",
                    (table, gen),
                )
            if not present or not same_shape(latest[1], schema):  # not just constraints
                copy_rows(self._conn, schema, gen, None)
            log.info(
                "captured table changed shape; schema and rows logged",
                table=table,
                generation=gen,
                rebuilt=not present,
            )
        return gen

    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA schema_version").fetchone()[0])

    def refresh(self) -> list[str]:
        """Rebuild the capture of every captured table whose schema changed (shapes.py)."""
        c = self._conn
        changed: list[str] = []
        c.execute("BEGIN IMMEDIATE")
        try:
            tables = [r[0] for r in c.execute("SELECT DISTINCT tbl FROM _txrepl_pubs")]
            for table in tables:
                before = self._latest(table)
                try:
                    gen = self._refresh_table(table, log_change=True)
                except SourceError as exc:  # dropped, or mid-rebuild in autocommit steps
                    log.warning("captured table cannot be read; retried on the next change",
                                table=table, error=str(exc))  # fmt: skip
                    continue
                if before is None or before[0] != gen:
                    changed.append(table)
            self._schema_version = self.schema_version()
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return changed

    # -- installation -----------------------------------------------------------

    def install(self, publication: str, incarnation: str, tables: Sequence[str]) -> list[str]:
        """Make the source capture ``tables`` for ``publication``; returns tables newly added.

        A table already installed for this publication and incarnation keeps its
        capture (a schema change since is logged as while running: shapes.py);
        a new one gets schema + snapshot rows.
        """
        added: list[str] = []
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            installed = {
                tbl: inc
                for tbl, inc in c.execute(
                    "SELECT tbl, incarnation FROM _txrepl_pubs WHERE publication = ?",
                    (publication,),
                )
            }
            for gone in set(installed) - set(tables):
                c.execute(
                    "DELETE FROM _txrepl_pubs WHERE publication = ? AND tbl = ?",
                    (publication, gone),
                )
            captured = {r[0] for r in c.execute("SELECT DISTINCT tbl FROM _txrepl_pubs")}
            for table in tables:
                gen = self._refresh_table(table, log_change=table in captured)
                if installed.get(table) == incarnation:
                    continue
                schema = self._shape(gen, table).schema
                cur = c.execute(
                    "INSERT INTO _txrepl_capture(pub, tbl, op, v, gen) VALUES (?, ?, 'S', ?, ?)",
                    (publication, table, schema.SerializeToString(), gen),
                )
                added_id = cur.lastrowid
                copy_rows(c, schema, gen, publication)
                c.execute(
                    "INSERT OR REPLACE INTO _txrepl_pubs VALUES (?, ?, ?, ?)",
                    (publication, incarnation, table, added_id),
                )
                added.append(table)
            self._drop_unused_triggers()
            self._schema_version = self.schema_version()
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        if added:
            log.info("capture installed", publication=publication, tables=added)
        return added

    def _drop_unused_triggers(self) -> None:
        used = {r[0] for r in self._conn.execute("SELECT DISTINCT tbl FROM _txrepl_pubs")}
        fallbacks = {fallback_name(t) for t in used}
        for kind, name, tbl in self._conn.execute(
            "SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('trigger', 'table') "
            "AND name LIKE '\\_txrepl\\_%' ESCAPE '\\'"
        ).fetchall():
            if kind == "trigger" and tbl not in used:
                self._conn.execute(f"DROP TRIGGER IF EXISTS {qident(name)}")
            elif kind == "table" and name.startswith("_txrepl_fb_") and name not in fallbacks:
                self._conn.execute(f"DROP TABLE IF EXISTS {qident(name)}")

    def installed(self) -> dict[str, dict[str, int]]:
        """publication -> table -> added_id."""
        out: dict[str, dict[str, int]] = {}
        for pubname, tbl, added in self._conn.execute(
            "SELECT publication, tbl, added_id FROM _txrepl_pubs"
        ):
            out.setdefault(pubname, {})[tbl] = added
        return out

    # -- reading ------------------------------------------------------------------

    def changed(self) -> bool:
        """True when another connection committed since the last call (cheap)."""
        (version,) = self._conn.execute("PRAGMA data_version").fetchone()
        if version != self._data_version:
            self._data_version = version
            return True
        return False

    def read(
        self, after_id: int, upto_id: int | None = None, *, max_bytes: int | None = None
    ) -> list[CapturedRow]:
        """Captured rows with after_id < id (<= upto_id), in id order, in one read transaction.

        ``max_bytes``: stop after the row that brings the rows' ``k`` and ``v`` to
        that many bytes, or after :data:`CHUNK_ROWS` rows (at least one row is
        read: the caller continues after the last id); a ``k`` or ``v`` longer
        than it alone is not read at all (None, with ``size`` set:
        :meth:`build_entries` refuses the row by name).

        If the source's schema moved since the last refresh, refresh first (in
        the same read transaction as the rows, the schema version is checked):
        the rows returned were all written after any change was logged.
        """
        c = self._conn
        big = max_bytes if max_bytes is not None else 2**62
        query = (
            "SELECT id, pub, tbl, op,"
            " CASE WHEN length(k) > :big THEN NULL ELSE k END,"
            " CASE WHEN length(v) > :big THEN NULL ELSE v END, gen,"
            " coalesce(length(k), 0) + coalesce(length(v), 0), origin"
            " FROM _txrepl_capture WHERE id > :after AND id <= :upto ORDER BY id"
        )
        bounds = {
            "after": after_id,
            "upto": upto_id if upto_id is not None else 2**63 - 1,
            "big": big,
        }

        def fetch() -> list[CapturedRow]:
            cur = c.execute(query, bounds)
            try:
                if max_bytes is None:
                    return list(map(CapturedRow._make, cur))
                got: list[tuple[object, ...]] = []
                total = 0
                for r in cur:  # row by row: the bytes read stay within max_bytes
                    got.append(r)
                    total += r[7]
                    if total >= max_bytes or len(got) >= CHUNK_ROWS:
                        break
                return list(map(CapturedRow._make, got))
            finally:
                cur.close()  # the statement ends before the read transaction does

        def current() -> list[CapturedRow] | None:
            c.execute("BEGIN")
            try:
                return fetch() if self.schema_version() == self._schema_version else None
            finally:
                c.execute("COMMIT")

        for _ in range(10):
            got = self._waiting(current)
            if got is not None:
                return got
            self._waiting(self.refresh)
        # DDL faster than we can follow: the rows are still exact (their generation says
        # their shape); the next poll logs the change.
        return self._waiting(fetch)

    def release(self, upto_id: int) -> None:
        """Delete captured rows that every publication has durably logged, in small batches."""
        delete_released(self._conn, upto_id, self._waiting)

    def max_id(self, conn: sqlite3.Connection | None = None) -> int:
        """The highest capture id ever handed out (rows may have been released since)."""
        row = (
            (conn or self._conn)
            .execute("SELECT seq FROM sqlite_sequence WHERE name = '_txrepl_capture'")
            .fetchone()
        )
        return int(row[0]) if row else 0

    def forget(self, publication: str) -> None:
        """An entry built for ``publication`` was not logged: repeat its schema ops."""
        for key in [k for k in self._logged if k[0] == publication]:
            del self._logged[key]
