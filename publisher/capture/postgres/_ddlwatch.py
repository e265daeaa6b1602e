"""A PostgreSQL source's DDL with no later write to its table: noticed by the capture.

pgoutput tells a table's schema changed only with a relation message before the
table's next change: an ``ALTER TABLE`` (or ``CREATE INDEX``, ``ADD CONSTRAINT``)
followed by no write left the target on the old shape, maybe for good.  An event
trigger would see the DDL at once but needs a superuser, which capture does not.

So the capture watches: while idle, at most once per ``interval_s``, one catalog query
reads a fingerprint of each published table (columns with their types, NOT NULL and
defaults; constraints with their definitions; indexes).  When one moved, the capture
writes a **transactional logical message** (``pg_logical_emit_message(true,
'txrepl.ddl', <the tables' names>)``; needs only the replication privilege capture
already has) and the stream decodes it (pgoutput's ``messages`` option) as a
transaction of its own, committed at ``P``.  There the session reads the tables'
shapes from the catalog and logs a schema op for each that differs from the one
logged (``_session.Session._ddl``), with a copy of the table when the change needs
one (``_evolve.py``), exactly as for a relation message.

Ordering: ``P`` commits after the DDL's ``D`` (the catalog showed the change before
the message was written); a change of the table between ``D`` and ``P`` came with a
relation message and its schema op already, so the message then finds nothing to log.
The argument for constraints (``common/constraints.py``) holds as for a relation
message: the table's state at ``P`` is a state after ``D``.  The first look after
the capture starts only takes the fingerprints: a message then would be decoded
where the stream stands (maybe well behind the catalog it read, at start-up), and
would log a table's newer shape before rows of its older one.  So a DDL made while
the publisher was down, with no write after it, is logged at the table's next
change, as before the watch.

Cost: one catalog query per second while idle; a DDL is noticed within about a
second plus the decoding lag.  Both plugins decode the message (pgoutput with its
``messages`` option; wal2json, format 2, as an ``"action": "M"`` line between the
transaction's ``B`` and ``C``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from publisher.capture.postgres._pgoutput import RelColumn

__all__ = ["PREFIX", "DdlWatch", "relcols"]

PREFIX = "txrepl.ddl"

_FINGERPRINT = """
SELECT t, md5(concat_ws('|',
  (SELECT string_agg(concat_ws(':', attname, atttypid, atttypmod, attnotnull, atthasdef,
                               atthasmissing, attgenerated), ',' ORDER BY attnum)
     FROM pg_attribute WHERE attrelid = to_regclass(t) AND attnum > 0 AND NOT attisdropped),
  (SELECT string_agg(conname || pg_get_constraintdef(oid) || convalidated, ',' ORDER BY conname)
     FROM pg_constraint WHERE conrelid = to_regclass(t)),
  (SELECT string_agg(indexrelid::regclass::text || indisvalid, ',' ORDER BY indexrelid)
     FROM pg_index WHERE indrelid = to_regclass(t))))
FROM unnest(%s::text[]) AS t
"""


def relcols(conn: psycopg.Connection[Any], table_sql: str) -> list[RelColumn]:
    """The table's columns as a relation message would give them (no generated ones)."""
    rows = conn.execute(
        "SELECT attname, atttypid, atttypmod FROM pg_attribute"
        " WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped"
        " AND attgenerated = '' ORDER BY attnum",
        (table_sql,),
    ).fetchall()
    return [RelColumn(str(n), int(o), int(m)) for n, o, m in rows]


class DdlWatch:
    """Writes a ``txrepl.ddl`` message when a published table's catalog moved."""

    def __init__(
        self,
        admin: Callable[[], psycopg.Connection[Any]],
        lock: threading.Lock,
        interval_s: float = 1.0,
    ) -> None:
        self._admin = admin
        self._lock = lock
        self.interval_s = interval_s
        self._seen: dict[str, str] | None = None  # None: not looked yet
        self._next = 0.0

    def poll(self, tables: Mapping[str, str]) -> list[str]:
        """Look if due; ``tables``: display name -> SQL name.  Returns the tables
        the message named (empty: none moved, or not due)."""
        now = time.monotonic()
        if now < self._next or not tables:
            return []
        self._next = now + self.interval_s
        names = {sql_name: display for display, sql_name in tables.items()}
        conn = self._admin()
        with self._lock:
            rows = conn.execute(_FINGERPRINT, (list(names),)).fetchall()
        now_seen = {names[str(t)]: str(fp) for t, fp in rows}
        before = self._seen
        if before is None:  # the first look: fingerprints only (see the docstring)
            self._seen = now_seen
            return []
        moved = sorted(t for t, fp in now_seen.items() if before.get(t) != fp)
        if moved:
            with self._lock:
                conn.execute(
                    "SELECT pg_logical_emit_message(true, %s, %s)", (PREFIX, "\n".join(moved))
                )
        self._seen = now_seen  # after the message: a failed one is written again
        return moved
