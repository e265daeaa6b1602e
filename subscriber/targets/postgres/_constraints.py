"""Which PostgreSQL target tables need the constraint-safe order (``subscriber/apply/_order.py``).

A table with a unique index other than its primary key (a UNIQUE constraint's or
a plain ``CREATE UNIQUE INDEX``, partial or on expressions) or an EXCLUDE
constraint, unless the constraint is ``INITIALLY DEFERRED`` (checked at commit,
against the final state).  A ``DEFERRABLE INITIALLY IMMEDIATE`` one counts: it is
checked at the end of each statement, and a rows step is several statements.
Foreign keys do not count: the writer's ``session_replication_role = replica``
silences them (``_order.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from subscriber.targets.postgres._names import table_sql

__all__ = ["PostgresOrderedTables"]

_ORDERED = """
SELECT t FROM unnest(%s::text[]) AS t
WHERE EXISTS (
    SELECT 1 FROM pg_index i
    LEFT JOIN pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = i.indrelid
    WHERE i.indrelid = to_regclass(t)
      AND i.indisunique AND NOT i.indisprimary AND NOT coalesce(k.condeferred, false)
) OR EXISTS (
    SELECT 1 FROM pg_constraint k
    WHERE k.conrelid = to_regclass(t) AND k.contype = 'x' AND NOT k.condeferred
)
"""


class PostgresOrderedTables:
    """``Writer.ordered_tables`` for :class:`subscriber.targets.postgres.writer.PostgresWriter`."""

    _lock: threading.Lock
    _run: Callable[..., Any]

    def ordered_tables(self, tables: Iterable[str]) -> frozenset[str]:
        names = list(tables)

        def body(cur: psycopg.Cursor[Any]) -> frozenset[str]:
            sql_names = {table_sql(t).as_string(cur): t for t in names}  # "s"."t" -> s.t
            cur.execute(_ORDERED, (list(sql_names),))
            return frozenset(sql_names[r[0]] for r in cur.fetchall())

        with self._lock:
            found: frozenset[str] = self._run("", None, body)
            return found


def refusal_text(exc: psycopg.Error) -> str:
    """The driver's error in one line naming, when the server says them, the table,
    the constraint and the key (``Key (email)=(a) already exists.``, ``Failing row
    contains ...``): what an operator needs to find the cause of a refused batch."""
    diag = exc.diag
    primary = diag.message_primary or (str(exc).splitlines() or [""])[0]
    where = [
        f"{what} {value}"
        for what, value in (("table", diag.table_name), ("constraint", diag.constraint_name))
        if value
    ]
    if diag.message_detail:
        where.append(diag.message_detail)
    if not where:
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {primary} ({'; '.join(where)})"
