"""Replicated changes do not fire the SQLite target's own triggers (a replica role).

PostgreSQL's writer sets ``session_replication_role = replica``: user triggers
skip the replicated changes (they fired once already, on the source), unless
they are ``ENABLE ALWAYS``.  SQLite has no such switch, so the writer makes one:

* a table ``txrepl_applying`` that holds one row only inside the writer's own
  batch transaction (inserted after ``BEGIN IMMEDIATE``, deleted before
  ``COMMIT``; a rollback removes it too).  No other connection ever sees the row:
  SQLite has one writer at a time and readers see committed data only.
* every trigger of the target's main schema carries the guard
  ``WHEN NOT EXISTS (SELECT 1 FROM txrepl_applying)`` (AND-ed with its own WHEN
  clause, if any).  The writer adds it, in the batch's transaction, to any
  trigger that lacks it, whenever ``PRAGMA schema_version`` says the schema
  changed since it last looked: an operator may create triggers at any time.
  For the application's own writes the table is empty and the trigger behaves
  as it was written; for replicated rows, replicated SQL statements and
  procedure calls it does not fire, as under PostgreSQL's replica role.
* a trigger that names ``txrepl_applying`` is left alone: txrepl's own capture
  triggers, on a target that is also published, read the row's ``origin`` to
  tag the changes they capture (common/origin.py, R2) instead of skipping them.
* a trigger whose text contains ``txrepl:always`` (e.g. in a comment of its
  body) is left alone and fires for replicated changes too: the
  ``ENABLE ALWAYS`` of SQLite targets.

Rejected: a function registered on the writer's connection (every other
connection, the application's, would fail with "no such function" in the
guarded trigger); a TEMP table (the same, "no such table"); dropping and
re-creating the triggers around every batch (two schema changes per batch,
which invalidates every prepared statement of every connection to the file).
The guard costs one lookup in an empty table per trigger firing.
"""

from __future__ import annotations

import sqlite3

from common.origin import APPLYING_TABLE

__all__ = ["ALWAYS", "APPLYING_TABLE", "GUARD", "TriggerGuard", "guarded"]

GUARD = f"NOT EXISTS (SELECT 1 FROM {APPLYING_TABLE})"
ALWAYS = "txrepl:always"


def _tokens(sql: str) -> list[tuple[int, str]]:
    """(offset, upper-cased word) of the bare words of ``sql`` (quotes and comments skipped)."""
    out: list[tuple[int, str]] = []
    i, n = 0, len(sql)
    closers = {"'": "'", '"': '"', "`": "`", "[": "]"}
    while i < n:
        ch = sql[i]
        if ch in closers:
            end = sql.find(closers[ch], i + 1)
            while end != -1 and ch != "[" and sql[end + 1 : end + 2] == ch:  # doubled quote
                end = sql.find(closers[ch], end + 2)
            i = n if end == -1 else end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end == -1 else end + 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end == -1 else end + 2
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (sql[j].isalnum() or sql[j] in "_$"):
                j += 1
            out.append((i, sql[i:j].upper()))
            i = j
        else:
            i += 1
    return out


def guarded(sql: str) -> str | None:
    """The CREATE TRIGGER text with the guard added, or None if it needs none."""
    if APPLYING_TABLE in sql or ALWAYS in sql:
        return None
    words = _tokens(sql)
    begin = next((i for i, w in words if w == "BEGIN"), None)
    if begin is None:
        return None
    when = next((i for i, w in words if w == "WHEN" and i < begin), None)
    if when is None:
        return f"{sql[:begin]}WHEN {GUARD} {sql[begin:]}"
    condition = sql[when + 4 : begin].strip()
    return f"{sql[:when]}WHEN {GUARD} AND ({condition}) {sql[begin:]}"


class TriggerGuard:
    """Keeps every trigger of one SQLite connection's main schema guarded."""

    def __init__(self) -> None:
        self._seen = -1  # schema_version after the last check

    def ensure(self, conn: sqlite3.Connection) -> list[str]:
        """Guard the unguarded triggers (inside the caller's transaction); their names."""
        (version,) = conn.execute("PRAGMA schema_version").fetchone()
        if version == self._seen:
            return []
        done: list[str] = []
        for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
        ).fetchall():
            new = guarded(sql or "")
            if new is None:
                continue
            conn.execute(f'DROP TRIGGER "{name.replace(chr(34), chr(34) * 2)}"')
            conn.execute(new)
            done.append(name)
        (self._seen,) = conn.execute("PRAGMA schema_version").fetchone()
        return done

    def forget(self) -> None:
        """The transaction that guarded rolled back: look again next time."""
        self._seen = -1
