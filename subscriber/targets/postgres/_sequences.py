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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import sql

from subscriber.targets.postgres._names import table_sql

__all__ = ["advance_sequences"]

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


def advance_sequences(
    cur: Any, tables: Iterable[str], owned: dict[str, list[tuple[str, str]]]
) -> None:
    """Move the sequences of ``tables`` (wire names) up to their columns' largest values;
    ``owned``: the writer's cache of (column, sequence) by table."""
    for table in dict.fromkeys(tables):
        name = table_sql(table)
        if table not in owned:
            owned[table] = cur.execute(_OWNED, (name.as_string(cur),)).fetchall()
        for column, seq in owned[table]:
            cur.execute(
                sql.SQL(
                    "SELECT setval(r, m) FROM (SELECT to_regclass(%(seq)s) AS r) q,"
                    " (SELECT max({}) AS m FROM {}) x WHERE r IS NOT NULL AND m >"
                    " coalesce(pg_sequence_last_value(r),"
                    " (SELECT seqstart - 1 FROM pg_sequence WHERE seqrelid = r))"
                ).format(sql.Identifier(column), name),
                {"seq": seq},
            )
