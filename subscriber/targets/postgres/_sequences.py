"""Sequences of a PostgreSQL target's tables follow the rows the publisher sends.

Rows arrive with the publisher's values in identity and serial columns (``OVERRIDING
SYSTEM VALUE``), so the target's own sequences never move: a target promoted to take
writes would hand out ids the source already used, and its first INSERT would fail
with a duplicate key.  After a batch's rows are written, in the same transaction, each
sequence owned by a column of a table the batch wrote (``pg_get_serial_sequence``:
identity and serial columns) is moved up to the column's largest value, never down:

    SELECT setval(seq, m) FROM (SELECT max(col) AS m FROM t) x
     WHERE m > coalesce(pg_sequence_last_value(seq), <start> - 1)

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
   AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
  JOIN pg_sequence s ON s.seqrelid = d.objid AND s.seqincrement > 0
 WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
   AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid
               AND i.indkey[0] = a.attnum)
"""


def advance_sequences(cur: Any, tables: Iterable[str]) -> None:
    """Move the sequences of ``tables`` (wire names) up to their columns' largest values."""
    for table in dict.fromkeys(tables):
        name = table_sql(table)
        for column, seq in cur.execute(_OWNED, (name.as_string(cur),)).fetchall():
            cur.execute(
                sql.SQL(
                    "SELECT setval(%(seq)s::regclass, m) FROM (SELECT max({}) AS m FROM {}) x"
                    " WHERE m > coalesce(pg_sequence_last_value(%(seq)s::regclass),"
                    " (SELECT seqstart - 1 FROM pg_sequence"
                    "  WHERE seqrelid = %(seq)s::regclass))"
                ).format(sql.Identifier(column), name),
                {"seq": seq},
            )
