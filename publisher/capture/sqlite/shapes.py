"""Schema evolution of a SQLite source: triggers that survive ALTER TABLE, shapes.

The problem
===========
SQLite has no DDL triggers, and ``ALTER TABLE t DROP COLUMN c`` refuses to run
when any trigger names ``c`` ("error in trigger ... after drop column: no such
column: NEW.c").  Capture triggers that read ``NEW.c`` therefore broke the
application's own migrations, and triggers built for the old column list kept
writing old-width rows after an ``ADD COLUMN`` until the publisher restarted,
when rows of two widths met in the log.

Triggers that name no droppable column
======================================
The row image is read back from the table by primary key, in a scalar subquery
whose column names are *unqualified*, inside a query over a one-row fallback
table ``_txrepl_fb_<t>`` that has one column per column of ``t``::

    INSERT INTO _txrepl_capture(tbl, op, k, v, gen, origin)
      SELECT 't', 'I', NULL,
             (SELECT CAST(<"id"> || <"a"> || <"c"> AS BLOB)
                FROM "t" WHERE "t"."id" IS NEW."id"),
             17, (SELECT origin FROM txrepl_applying)
        FROM "_txrepl_fb_t";

(``<x>`` is one value of the packed image: see "The row image" below.
``origin``: NULL for the application's writes, the origin txrepl's apply is
writing otherwise: common/origin.py, R2; an installation whose triggers predate
it gets them rebuilt, same generation, when the publisher starts.)

SQLite resolves an unqualified name in the innermost scope that has it: while
``t`` has ``c``, ``c`` is ``t.c`` (the AFTER trigger sees the row as written);
once ``c`` is dropped it resolves to the fallback table's ``c`` (NULL), so the
trigger still compiles and ``DROP COLUMN`` succeeds.  Only primary key columns
are named through ``NEW``/``OLD``, and SQLite never drops those.  ``RENAME
COLUMN`` rewrites the references in the trigger, as it does for every trigger.
The price is one primary key lookup per captured insert or update: on this
machine, inserts plus updates through the triggers went from 190-200k to
150-180k captured changes/s (100 per transaction, 2026-11-24, a throwaway
script; W1 catch-up was not re-measured).

The row image
=============
``k`` and ``v`` are *packed images*: a BLOB concatenating, per column, ::

    t<n>:<n bytes>   TEXT, its bytes as stored (a NUL or invalid UTF-8 included)
    b<n>:<n bytes>   BLOB
    <quote(x)>,      INTEGER, REAL (quote() prints enough digits to round-trip), NULL

``<n>`` in decimal ASCII.  SQL per value (``packed``)::

    CASE typeof(x) WHEN 'text' THEN 't' || length(CAST(x AS BLOB)) || ':' || CAST(x AS BLOB)
                   WHEN 'blob' THEN 'b' || length(x) || ':' || x
                   ELSE quote(x) || ',' END

A value is read from the row once or twice (``typeof`` of a column does not
load it), copied as it is, never scanned character by character.  It replaced
``json_array(<literal>, ...)`` where each literal was ``CASE WHEN typeof(x) =
'text' AND instr(CAST(x AS BLOB), X'00') THEN 't' || quote(CAST(x AS BLOB))
ELSE quote(x) END``: each value loaded twice, scanned by ``instr`` for a NUL,
by ``quote`` for quotes and by ``json_array`` for characters to escape; on 100
KB text that was most of the application's extra write time (measured in
docs/capture-sqlite.md).  Capture rows written by older builds (JSON TEXT)
still decode: the storage class of ``v`` tells the two apart, and installation
rebuilds such triggers in place (same generation: same shape, only the
encoding differs).

Shapes and generations
======================
Each build of a table's triggers is a *generation* ``gen`` (a row of
``_txrepl_shapes``: the table's ``TableSchema`` as built) and the triggers write
that number as a literal into every capture row.  A captured row is therefore
always decoded with the column list it was written with, never with whatever
the table looks like when the capture reads it: no row is ever of two widths.
The capture emits the shape's schema op before the first row of a generation
it has not yet logged for a publication (after a restart, once per table: a
schema op is a full definition, so repeating it is harmless).

Noticing a change (``SqliteCapture.refresh``)
=============================================
Every poll reads ``PRAGMA schema_version`` in the same read transaction as the
capture rows.  When it moved since the capture last looked, the poll first
runs a refresh in ONE write transaction (``BEGIN IMMEDIATE``, so no
application write interleaves) and then reads again.  For every captured table
whose schema differs from its latest generation's, or whose triggers are gone,
the refresh

1. builds a new generation (fallback table, triggers);
2. appends an ``'S'`` row with the new schema, for every publication of the
   table;
3. if the triggers were gone (the table was rebuilt the SQLite way: create the
   new table, copy, drop the old one, rename; dropping the old table dropped
   its triggers, so later changes may be missing), appends a ``'T'``
   (truncate) row;
4. copies every current row as an ``'I'`` row of the new generation.

The copy is what makes the target equal again whatever happened between the
change and the refresh: an ``ADD COLUMN ... DEFAULT`` fills existing rows on
the source without any row change (the copy carries the defaults); a renamed
column arrives on the target as a dropped one plus an added one (the copy
fills the added one); rows written between the ALTER and the refresh by the
previous generation's triggers hold NULL for a dropped column, a renamed
column's value under its old name, and nothing for an added column: they keep
the old shape (they are decoded with their generation), are logged before the
``'S'`` row, and the copy then overwrites them.  Deletes are captured by key
throughout, so the copy (an upsert per key) needs no truncate, except after a
rebuild (step 3).  A crash anywhere is safe: the new triggers, the ``'S'`` row
and the copy commit together, and capture rows leave the source only once
logged.  Rejected: re-reading rows at poll time (it would put later
transactions' values into earlier entries), logging only the schema (silently
diverges on defaults and renames, as the issue reports for PostgreSQL), a
sentinel in dropped columns (the copy makes it unnecessary).

The cost is a copy of the table into the log per schema change; SQLite's own
``ADD COLUMN`` is O(1), so this is the expensive part of a migration on a large
table.  Not seen: dropping and re-adding a column with the same name and
definition between two polls (e.g. in one transaction) leaves the same schema
and triggers, so nothing is copied and the target keeps the old values.
"""

from __future__ import annotations

import sqlite3

from common.names import quote_ident
from common.origin import APPLYING_TABLE
from common.rpc import txrepl_pb2 as pb

__all__ = [
    "TRIGGER_TAGS",
    "build_triggers",
    "carry_origin",
    "copy_rows",
    "fallback_name",
    "pack",
    "packed",
    "qident",
    "trigger_name",
]

TRIGGER_TAGS = ("i", "u", "d")
# What the triggers write as a capture row's origin: the apply's, or NULL.  The name
# in their text also keeps the SQLite target's trigger guard off them (R2).
ORIGIN = f"(SELECT origin FROM {APPLYING_TABLE})"


qident = quote_ident


def trigger_name(tag: str, table: str) -> str:
    return f"_txrepl_{tag}_{table}"


def fallback_name(table: str) -> str:
    return f"_txrepl_fb_{table}"


def packed(expr: str) -> str:
    """SQL for one value of a packed image (module docstring, "The row image")."""
    return (
        f"CASE typeof({expr})"
        f" WHEN 'text' THEN 't' || length(CAST({expr} AS BLOB)) || ':' || CAST({expr} AS BLOB)"
        f" WHEN 'blob' THEN 'b' || length({expr}) || ':' || {expr}"
        f" ELSE quote({expr}) || ',' END"
    )


def pack(exprs: list[str]) -> str:
    """SQL for the packed image of ``exprs`` (a BLOB)."""
    return f"CAST({' || '.join(packed(e) for e in exprs)} AS BLOB)"


def _image(schema: pb.TableSchema, key_from: str) -> str:
    """The row image read back by primary key (unqualified names: see the docstring)."""
    t = qident(schema.table)
    cols = pack([qident(c.name) for c in schema.columns])
    where = " AND ".join(f"{t}.{qident(k)} IS {key_from}.{qident(k)}" for k in schema.primary_key)
    return f"(SELECT {cols} FROM {t} WHERE {where})"


def build_triggers(conn: sqlite3.Connection, schema: pb.TableSchema, gen: int) -> None:
    """(Re)create the fallback table and the three capture triggers of generation ``gen``."""
    t = schema.table
    fb = qident(fallback_name(t))
    conn.execute(f"DROP TABLE IF EXISTS {fb}")
    conn.execute(f"CREATE TABLE {fb} ({', '.join(qident(c.name) for c in schema.columns)})")
    conn.execute(f"INSERT INTO {fb} DEFAULT VALUES")
    old_key = pack([f"OLD.{qident(k)}" for k in schema.primary_key])
    lit = t.replace("'", "''")
    new = _image(schema, "NEW")
    org = ORIGIN  # NULL for the application's writes (common/origin.py, R2)
    bodies = {
        "i": ("INSERT", f"SELECT '{lit}', 'I', NULL, {new}, {gen}, {org} FROM {fb}"),
        "u": ("UPDATE", f"SELECT '{lit}', 'U', {old_key}, {new}, {gen}, {org} FROM {fb}"),
        "d": ("DELETE", f"VALUES('{lit}', 'D', {old_key}, NULL, {gen}, {org})"),
    }
    for tag, (event, values) in bodies.items():
        name = qident(trigger_name(tag, t))
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        conn.execute(
            f"CREATE TRIGGER {name} AFTER {event} ON {qident(t)} BEGIN "
            f"INSERT INTO _txrepl_capture(tbl, op, k, v, gen, origin) {values}; END"
        )


def carry_origin(conn: sqlite3.Connection, table: str) -> bool:
    """Whether ``table``'s capture triggers copy the apply's origin (built since issue 24)."""
    names = [trigger_name(tag, table) for tag in TRIGGER_TAGS]
    found = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name IN (?, ?, ?)", names
    ).fetchall()
    return len(found) == len(names) and all(ORIGIN in (sql or "") for (sql,) in found)


def copy_rows(
    conn: sqlite3.Connection, schema: pb.TableSchema, gen: int, publication: str | None
) -> None:
    """Every current row of the table as an 'I' capture row of generation ``gen``."""
    image = pack([qident(c.name) for c in schema.columns])
    conn.execute(
        f"INSERT INTO _txrepl_capture(pub, tbl, op, v, gen) "
        f"SELECT ?, ?, 'I', {image}, ? FROM {qident(schema.table)}",
        (publication, schema.table, gen),
    )
