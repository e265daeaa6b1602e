"""Trigger-based capture from a SQLite source (the embedded default).

How it works
============
Everything that reaches a publication's log passes through ONE capture table in
the source database, written by triggers in the writer's own transaction::

    _txrepl_capture(id INTEGER PRIMARY KEY AUTOINCREMENT,
                    pub TEXT,        -- NULL: every publication holding tbl;
                                     -- else only this publication (snapshots)
                    tbl TEXT, op TEXT,   -- 'I' 'U' 'D' row changes, 'S' schema
                    k, v)            -- k: old primary key, v: new row, each a JSON
                                     -- array of SQL literals from quote(); for 'S',
                                     -- v is a serialized txrepl.v1.TableSchema
    _txrepl_pubs(publication, incarnation, tbl, added_id)   -- what is installed

* Order.  SQLite serialises writers, so AUTOINCREMENT ids are handed out in commit
  order.  A reader sees only whole committed transactions, so one poll (one read
  transaction) yields whole transactions in commit order; they become one entry
  per publication (group commit).  SQLite gives triggers no transaction id, so
  an entry may hold several consecutive transactions, never part of one.
* Exact values.  quote() renders integers, text, blobs (X'..') and reals with
  enough digits to round-trip, unlike json_array's 15-digit reals.
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

Limits (documented in the README): a table needs a primary key; a schema change
on a published table is picked up by re-installation (publisher restart), and
rows written between the ALTER and the restart carry the old columns only.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from common.rpc import txrepl_pb2 as pb
from common.values import encode, parse_declared_type
from publisher.errors import SourceError

__all__ = ["CapturedRow", "SqliteCapture", "parse_sql_literal", "qident"]

log = structlog.get_logger(__name__)

_SETUP = """
CREATE TABLE IF NOT EXISTS _txrepl_capture(
    id INTEGER PRIMARY KEY AUTOINCREMENT, pub TEXT, tbl TEXT NOT NULL,
    op TEXT NOT NULL, k, v);
CREATE TABLE IF NOT EXISTS _txrepl_pubs(
    publication TEXT NOT NULL, incarnation TEXT NOT NULL, tbl TEXT NOT NULL,
    added_id INTEGER NOT NULL, PRIMARY KEY (publication, tbl));
"""


def qident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def parse_sql_literal(text: str) -> object:
    """Parse one SQL literal as produced by SQLite's quote()."""
    if text == "NULL":
        return None
    first = text[0]
    if first == "'":
        return text[1:-1].replace("''", "'")
    if first in "Xx" and text[1:2] == "'":
        return bytes.fromhex(text[2:-1])
    if any(c in text for c in ".eE") or text in ("Inf", "-Inf"):
        return float(text)
    return int(text)


@dataclass(frozen=True, slots=True)
class CapturedRow:
    id: int
    pub: str | None
    tbl: str
    op: str
    k: object
    v: object


class SqliteCapture:
    """Installs capture on a SQLite source and turns captured rows into entries."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = path
        if not path.exists():
            raise SourceError(f"SQLite source {path} does not exist")
        self._conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
        )
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        self._conn.executescript(_SETUP)
        self._schemas: dict[str, pb.TableSchema] = {}
        self._types: dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
        self._data_version = -1

    def close(self) -> None:
        self._conn.close()

    # -- schema -----------------------------------------------------------------

    def read_schema(self, table: str) -> pb.TableSchema:
        rows = self._conn.execute(f"PRAGMA table_xinfo({qident(table)})").fetchall()
        if not rows:
            raise SourceError(f"table {table!r} does not exist in the SQLite source {self.path}")
        schema = pb.TableSchema(table=table)
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
            )
            if pkpos:
                pk.append((pkpos, name))
        if not pk:
            raise SourceError(
                f"table {table!r} in {self.path} has no PRIMARY KEY; txrepl needs one to "
                "replicate a table (add a primary key, or leave the table out of the publication)"
            )
        schema.primary_key.extend(name for _, name in sorted(pk))
        return schema

    def _remember(self, schema: pb.TableSchema) -> None:
        self._schemas[schema.table] = schema
        cols = [(int(c.type), c.scale) for c in schema.columns]
        by_name = {c.name: (int(c.type), c.scale) for c in schema.columns}
        self._types[schema.table] = (cols, [by_name[k] for k in schema.primary_key])

    # -- installation -----------------------------------------------------------

    def install(self, publication: str, incarnation: str, tables: Sequence[str]) -> list[str]:
        """Make the source capture ``tables`` for ``publication``; returns tables newly added.

        A table already installed for this publication and incarnation is left
        alone (its triggers are refreshed); a new one gets schema + snapshot rows.
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
            for table in tables:
                schema = self.read_schema(table)
                self._install_triggers(schema)
                self._remember(schema)
                if installed.get(table) == incarnation:
                    continue
                cur = c.execute(
                    "INSERT INTO _txrepl_capture(pub, tbl, op, v) VALUES (?, ?, 'S', ?)",
                    (publication, table, schema.SerializeToString()),
                )
                added_id = cur.lastrowid
                cols = ", ".join(f"quote({qident(col.name)})" for col in schema.columns)
                c.execute(
                    f"INSERT INTO _txrepl_capture(pub, tbl, op, v) "
                    f"SELECT ?, ?, 'I', json_array({cols}) FROM {qident(table)}",
                    (publication, table),
                )
                c.execute(
                    "INSERT OR REPLACE INTO _txrepl_pubs VALUES (?, ?, ?, ?)",
                    (publication, incarnation, table, added_id),
                )
                added.append(table)
            self._drop_unused_triggers()
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        if added:
            log.info("capture installed", publication=publication, tables=added)
        return added

    def _install_triggers(self, schema: pb.TableSchema) -> None:
        t = schema.table
        new = ", ".join(f"quote(NEW.{qident(c.name)})" for c in schema.columns)
        old_key = ", ".join(f"quote(OLD.{qident(k)})" for k in schema.primary_key)
        lit = t.replace("'", "''")
        bodies = {
            "i": ("INSERT", f"VALUES('{lit}', 'I', NULL, json_array({new}))"),
            "u": ("UPDATE", f"VALUES('{lit}', 'U', json_array({old_key}), json_array({new}))"),
            "d": ("DELETE", f"VALUES('{lit}', 'D', json_array({old_key}), NULL)"),
        }
        for tag, (event, values) in bodies.items():
            name = qident(f"_txrepl_{tag}_{t}")
            self._conn.execute(f"DROP TRIGGER IF EXISTS {name}")
            self._conn.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON {qident(t)} BEGIN "
                f"INSERT INTO _txrepl_capture(tbl, op, k, v) {values}; END"
            )

    def _drop_unused_triggers(self) -> None:
        used = {r[0] for r in self._conn.execute("SELECT DISTINCT tbl FROM _txrepl_pubs")}
        for name, tbl in self._conn.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' "
            "AND name LIKE '\\_txrepl\\_%' ESCAPE '\\'"
        ).fetchall():
            if tbl not in used:
                self._conn.execute(f"DROP TRIGGER IF EXISTS {qident(name)}")

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

    def read(self, after_id: int, upto_id: int | None = None) -> list[CapturedRow]:
        """Every captured row with after_id < id (<= upto_id), in one read transaction."""
        rows = self._conn.execute(
            "SELECT id, pub, tbl, op, k, v FROM _txrepl_capture WHERE id > ? AND id <= ?"
            " ORDER BY id",
            (after_id, upto_id if upto_id is not None else 2**63 - 1),
        ).fetchall()
        return [CapturedRow(*r) for r in rows]

    def release(self, upto_id: int) -> None:
        """Delete captured rows that every publication has durably logged."""
        self._conn.execute("DELETE FROM _txrepl_capture WHERE id <= ?", (upto_id,))

    def max_id(self, conn: sqlite3.Connection | None = None) -> int:
        """The highest capture id ever handed out (rows may have been released since)."""
        row = (
            (conn or self._conn)
            .execute("SELECT seq FROM sqlite_sequence WHERE name = '_txrepl_capture'")
            .fetchone()
        )
        return int(row[0]) if row else 0

    def build_entry(
        self,
        publication: str,
        rows: Iterable[CapturedRow],
        after_id: int,
        tables: Mapping[str, int],
    ) -> tuple[pb.Entry | None, int]:
        """Ops of ``rows`` that belong to ``publication``; returns (entry or None, last id)."""
        entry = pb.Entry()
        last = after_id
        for r in rows:
            if r.id <= after_id:
                continue
            last = r.id
            added = tables.get(r.tbl)
            if added is None or r.id < added:
                continue
            if r.pub is not None and r.pub != publication:
                continue
            op = entry.ops.add()
            if r.op == "S":
                assert isinstance(r.v, bytes)
                schema = pb.TableSchema.FromString(r.v)
                self._remember(schema)
                op.schema.CopyFrom(schema)
                continue
            if r.tbl not in self._types:
                self._remember(self.read_schema(r.tbl))
            col_types, key_types = self._types[r.tbl]
            rc = op.row
            rc.table = r.tbl
            if r.op == "I":
                rc.op = pb.ROW_OP_INSERT
            elif r.op == "U":
                rc.op = pb.ROW_OP_UPDATE
            else:
                rc.op = pb.ROW_OP_DELETE
            if r.k is not None:
                assert isinstance(r.k, str)
                keys = json.loads(r.k)
                rc.key.extend(
                    encode(parse_sql_literal(x), t, s)
                    for x, (t, s) in zip(keys, key_types, strict=False)
                )
            if r.v is not None:
                assert isinstance(r.v, str)
                vals = json.loads(r.v)
                rc.row.extend(
                    encode(parse_sql_literal(x), t, s)
                    for x, (t, s) in zip(vals, col_types, strict=False)
                )
        if not entry.ops:
            return None, last
        entry.commit_time_us = int(time.time() * 1_000_000)
        entry.source_position = str(last)
        return entry, last
