"""Sequence positions of a PostgreSQL source, carried on the entries (issue 19).

Why: a target promoted to take writes must not hand out ids the source already
used.  The rows alone cannot say how far a sequence went: ids drawn by a rolled-back
transaction, or by rows deleted since, leave no row behind, and PostgreSQL 15's
logical decoding carries no sequence changes.  So the publisher reads the sequences
itself and writes their positions into the entries (``Entry.sequences``).

When.  A sequence is owned by a column of a published table (``pg_depend`` kinds
``a``: serial, ``i``: identity).  Its position is read:

* at the commit of every decoded transaction that inserted into that table (an
  insert is what draws from a sequence; an ``UPDATE ... SET id = nextval(...)`` is
  carried by the next insert, or the next snapshot), and written into that
  transaction's entry for each publication holding the table (its last fragment, if
  it has several);
* at a table's install snapshot (its last entry), so a table nobody writes to after
  the install still carries its position.

Ordering argument.  A sequence only moves up (``nextval``) outside transactions; the
value read at the decode of a commit is therefore at least its value at that commit
(it may be further: draws of transactions decoded later).  A target that moves its
own sequence up to the carried value, never down, in the same transaction as the
entry's rows, is then at every level at least where the source was at that level's
commit: its next id was never used by a row the target holds.  Being ahead only
skips ids.  An operator's ``setval`` down or ``ALTER SEQUENCE ... RESTART`` on the
source is not followed (the target keeps the higher position: never a used id).

Rejected: reading positions on a timer (a quiet table's last position would wait for
the next tick, and a tick needs an entry of its own: a seq without row changes);
``setval`` at the apply from the largest present id only (the target's own
``_sequences.py`` still does that, for sources that carry no positions: it misses
rolled-back and deleted ids).

Cost: the owned sequences of a table are read from the catalog once per table and
session; a transaction inserting into tables without one costs nothing (not even the
catalog lock); otherwise one
query per commit (all its sequences at once).  ``last_value`` is NULL (the position
is not carried) for a sequence never drawn from or one the capture role may not read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

import psycopg

from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres._pgcatalog import TableName

__all__ = ["SequencePositions"]

_OWNED = """
SELECT a.attname, d.objid::int8
  FROM pg_depend d
  JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
  JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
 WHERE d.refclassid = 'pg_class'::regclass AND d.classid = 'pg_class'::regclass
   AND d.refobjid = to_regclass(%s) AND d.deptype IN ('a', 'i') AND NOT a.attisdropped
"""

_POSITIONS = """
SELECT s.oid::int8, CASE WHEN has_sequence_privilege(s.oid, 'SELECT,USAGE')
                         THEN pg_sequence_last_value(s.oid) END
  FROM pg_class s WHERE s.oid = ANY(%s::oid[])
"""


class SequencePositions:
    """Reads the positions of the sequences owned by tables' columns (see the module doc)."""

    def __init__(
        self, conn: Callable[[], psycopg.Connection[tuple[Any, ...]]], lock: threading.Lock
    ) -> None:
        self._conn = conn
        self._lock = lock
        self._owned: dict[str, list[tuple[str, int]]] = {}
        self._none: set[TableName] = set()  # tables known to own no sequence

    def forget(self, table: str | None = None) -> None:
        """Read the owned sequences of ``table`` (None: of every table) again."""
        if table is None:
            self._owned.clear()
            self._none.clear()
        else:
            self._owned.pop(table, None)
            self._none = {t for t in self._none if t.display != table}

    def owning(self, groups: Iterable[Collection[TableName]]) -> bool:
        """False when every table of ``groups`` is known to own no sequence: nothing
        to :meth:`read` (a commit's check, cheaper than ``read``'s own: 0.8 against
        1.3-1.8 us)."""
        return not all(map(self._none.issuperset, groups))

    def read(self, tables: Iterable[TableName]) -> list[pb.SequencePosition]:
        """The positions of the sequences owned by ``tables``' columns, in table order."""
        tables = dict.fromkeys(tables)
        if self._none.issuperset(tables):
            return []  # every table known to own no sequence: no lock, no query
        wanted: list[tuple[str, str, int]] = []
        with self._lock:
            conn = self._conn()
            for t in tables:
                owned = self._owned.get(t.display)
                if owned is None:
                    rows = conn.execute(_OWNED, (t.sql,)).fetchall()
                    owned = self._owned[t.display] = [(str(c), int(o)) for c, o in rows]
                    if not owned:
                        self._none.add(t)
                wanted.extend((t.display, column, oid) for column, oid in owned)
            if not wanted:
                return []
            values = dict(conn.execute(_POSITIONS, ([o for _, _, o in wanted],)).fetchall())
        return [
            pb.SequencePosition(table=table, column=column, last_value=int(values[oid]))
            for table, column, oid in wanted
            if values.get(oid) is not None
        ]
