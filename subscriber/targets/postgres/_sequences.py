"""Sequences of a PostgreSQL target's tables follow the rows the publisher sends.

Rows arrive with the publisher's values in identity and serial columns (``OVERRIDING
SYSTEM VALUE``), so the target's own sequences never move: a target promoted to take
writes would hand out ids the source already used, and its first INSERT would fail
with a duplicate key.  After a batch's rows are written, in the same transaction, each
sequence owned by a column of a table the batch wrote (identity and serial columns:
``pg_depend`` kinds ``i`` and ``a``) is moved up to the column's largest value, never down:

    SELECT setval(seq, m) FROM (SELECT max(col) AS m FROM t) x
     WHERE m > coalesce(pg_sequence_last_value(seq), <start> - 1)

Which sequences a table owns is read from the catalog once per table and writer (a SQL
step or a failed batch forgets it); an identity the operator adds to a target table
while the subscriber runs is seen after a restart.  A remembered sequence that is gone
(a reinit re-created its table) is skipped, not an error.
``max(col)`` is read only for a column an index leads with (an identity key always
is): one index probe, not a scan; a column without one is left alone.  Only ascending
sequences are moved.  What this does not carry: values the source drew and never kept
(rolled back, or rows deleted before the batch that would show them), so the target's
next id is one past the largest *present*, which may be below the source sequence's
own position.  A rolled-back batch rolls its ``setval`` back with it.

Positions carried by the publisher (:func:`carry_positions`): a PostgreSQL source
writes its sequences' positions into the entries (publisher/capture/postgres/
_sequences.py has when, and the ordering argument), and the engine hands the
highest per (table, column) of a write to the writer (subscriber/apply/
_sequences.py).  The sequence the target's own column owns (found as above) is
moved up to the carried position, never down and never past its ``MAXVALUE``, in
the same transaction: ids the source drew and never kept (rolled back, deleted)
are not handed out again by a promoted target.  A column the target table lacks,
or a target table without an owned sequence there, is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import sql

from subscriber.targets.postgres._names import table_sql

__all__ = ["advance_sequences", "carry_positions"]

_OWNED = """
SELECT a.attname, s.seqrelid::regclass::text
  FROM pg_attribute a
  JOIN pg_depend d ON d.refobjid = a.attrelid AND d.refobjsubid = a.attnum
   AND d.refclassid = 'pg_class'::regclass AND d.classid = 'pg_class'::regclass
   AND d.deptype IN ('a', 'i')
  JOIN pg_sequence s ON s.seqrelid = d.objid AND s.seqincrement > 0
 WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
   AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid
               AND i.indkey[0] = a.attnum)
"""


def _owned(cur: Any, table: str, owned: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str]]:
    if table not in owned:
        owned[table] = cur.execute(_OWNED, (table_sql(table).as_string(cur),)).fetchall()
    return owned[table]


def advance_sequences(
    cur: Any, tables: Iterable[str], owned: dict[str, list[tuple[str, str]]]
) -> None:
    """Move the sequences of ``tables`` (wire names) up to their columns' largest values;
    ``owned``: the writer's cache of (column, sequence) by table."""
    for table in dict.fromkeys(tables):
        name = table_sql(table)
        for column, seq in _owned(cur, table, owned):
            cur.execute(
                sql.SQL(
                    "SELECT setval(r, m) FROM (SELECT to_regclass(%(seq)s) AS r) q,"
                    " (SELECT max({}) AS m FROM {}) x WHERE r IS NOT NULL AND m >"
                    " coalesce(pg_sequence_last_value(r),"
                    " (SELECT seqstart - 1 FROM pg_sequence WHERE seqrelid = r))"
                ).format(sql.Identifier(column), name),
                {"seq": seq},
            )


_CARRY = """
SELECT setval(r, %(v)s) FROM (SELECT to_regclass(%(seq)s) AS r) q
  JOIN pg_sequence s ON s.seqrelid = q.r
 WHERE %(v)s <= s.seqmax AND %(v)s > coalesce(pg_sequence_last_value(q.r), s.seqstart - 1)
"""


def carry_positions(
    cur: Any, positions: dict[tuple[str, str], int], owned: dict[str, list[tuple[str, str]]]
) -> None:
    """Move the sequences owned by (table, column) up to the carried ``positions``."""
    for (table, column), value in positions.items():
        for col, seq in _owned(cur, table, owned):
            if col == column:
                cur.execute(_CARRY, {"v": value, "seq": seq})
