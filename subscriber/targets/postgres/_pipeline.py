"""Small batches into PostgreSQL in two round trips: statements, then COMMIT (issue 23).

A 1-20 entry in-sync batch used to cost ~16 client round trips (the level check,
a staging COPY and a merge per table and kind, a savepoint around the fresh rows'
COPY, the level row, COMMIT: a COPY alone is two).  Two changes bring it to two:

**Rows by statements.**  A rows step of at most :data:`SMALL_PARAMS` values per
statement is written without staging: its deletes as ``DELETE FROM t WHERE (k...)
IN ((...), ...)`` and its upserts (fresh rows included) as one ``INSERT INTO t
(...) OVERRIDING SYSTEM VALUE VALUES (...), ... ON CONFLICT (key) DO UPDATE``.
The values are sent as text of unknown type, the very text the COPY path writes
(``pyarrow``'s CSV writer is a cast to string per column, done here on the same
:func:`~subscriber.targets.postgres._copy.pg_column` arrays), so PostgreSQL parses
each with the target column's own input function and typmod, as COPY into a stage
of the target's types did (a too-long ``varchar`` is refused, not cut).  Larger
steps keep COPY: above a few thousand values one COPY is cheaper than parsing a
statement that long, and a statement takes at most 65,535 parameters.  The fresh
rows lose their plain-COPY savepoint (a present key is simply upserted).

**Pipeline mode.**  When every step of a committing batch is such a rows step (no
schema, truncate, SQL, call or history step, no JDBC stage, no conflict check, not
a piece of a held group nor a re-execution), the batch's transaction runs in
psycopg's pipeline mode: BEGIN, the session settings, the level row's lock
(``INSERT ... ON CONFLICT DO NOTHING``; ``SELECT ... FOR UPDATE`` on a cursor of
its own), the statements, ``setval`` of the sequences and the level row's update
are sent without waiting; reading the locked level (at the end, before COMMIT) is
the first wait, and COMMIT the second.  BEGIN and COMMIT are sent as statements
(:func:`run_pipelined`): psycopg's ``transaction()`` block syncs the pipeline four
times more.

Why the level check may come last.  The server runs the statements in the order
sent, so the level row is locked before any row is written, exactly as before: a
second applier on the same subscription still waits at that lock.  Nothing is
visible before COMMIT, and COMMIT is sent only after the level read back is the
one the batch follows (``first_seq - 1``, same incarnation): a mismatch raises
:class:`GapError` and the transaction rolls back, so a batch that does not follow
the level commits nothing, as when it was refused first.  What changes is which
error a batch that both mismatches and fails sees: the statement's error arrives
first, so on a driver error the level is read too (its result precedes the failed
statement's) and a mismatch is the error raised, as before, instead of a row
error that would send the entry to the error queue.  A statement that fails
makes the server skip the rest until the sync; nothing is committed either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import pq, sql

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.writer import RowsStep, Step
from subscriber.targets.conflicts import ConflictGuard
from subscriber.targets.metadata import MetadataSql
from subscriber.targets.postgres._copy import pg_column, upsert_sql
from subscriber.targets.postgres._names import table_sql

__all__ = [
    "SMALL_PARAMS",
    "level_checked_last",
    "pipelined",
    "rows_by_statements",
    "run_pipelined",
    "small",
]

Q = sql.Identifier
R = TypeVar("R")

# Values per statement up to which a rows step skips staging (PostgresWriter.small_values).
SMALL_PARAMS = 4_000


def small(step: RowsStep, limit: int) -> bool:
    """Whether ``step`` is written by statements (:func:`rows_by_statements`): at most
    ``limit`` values per statement (the writer's ``small_values``)."""
    columns = len(step.schema.columns)
    keys = len(step.schema.primary_key)
    return bool(step.upserts.num_rows * columns <= limit and step.deletes.num_rows * keys <= limit)


def pipelined(
    steps: Sequence[Step], subscription: str, guard: ConflictGuard | None, limit: int
) -> bool:
    """Whether a committing batch of ``steps`` runs in pipeline mode (module docstring)."""
    if not steps:
        return False
    for step in steps:
        if not isinstance(step, RowsStep) or not small(step, limit):
            return False
        if guard is not None and guard.spec(subscription, step.schema.table) is not None:
            return False
    return True


def _texts(rows: pa.Table, schema: pb.TableSchema, indexes: list[int]) -> list[Any]:
    """The cells of columns ``indexes`` as COPY's text (None for NULL), row by row."""
    columns = [
        pc.cast(pg_column(rows, i, schema.columns[i]), pa.string()).to_pylist() for i in indexes
    ]
    return [cell for row in zip(*columns, strict=True) for cell in row]


def _tuples(count: int, width: int) -> sql.Composed:
    one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() for _ in range(width)))
    return sql.SQL(", ").join([one] * count)


def rows_by_statements(cur: psycopg.Cursor[Any], step: RowsStep) -> int:
    """Write a small rows step: one DELETE, one INSERT ... ON CONFLICT (no fetch)."""
    schema = step.schema
    names = [c.name for c in schema.columns]
    keys = [names.index(k) for k in schema.primary_key]
    table = table_sql(schema.table)
    if step.deletes.num_rows:
        cols = sql.SQL(", ").join(Q(names[i]) for i in keys)
        cur.execute(
            sql.SQL("DELETE FROM {} WHERE ({}) IN ({})").format(
                table, cols, _tuples(step.deletes.num_rows, len(keys))
            ),
            _texts(step.deletes, schema, keys),
        )
    if step.upserts.num_rows:
        every = list(range(len(names)))
        source = sql.SQL("VALUES {}").format(_tuples(step.upserts.num_rows, len(names)))
        cur.execute(upsert_sql(schema, source), _texts(step.upserts, schema, every))
    return int(step.deletes.num_rows + step.upserts.num_rows)


def level_checked_last(
    cur: psycopg.Cursor[Any],
    metadata: MetadataSql,
    batch: tuple[str, str, int],
    statements: Callable[[], int],
) -> int:
    """Lock the level row, run ``statements()``, then check the level (before the
    caller's COMMIT); on a driver error a level mismatch is raised instead.
    ``batch``: (subscription, incarnation, first_seq)."""
    subscription, incarnation, first_seq = batch
    level_cur = cur.connection.cursor()  # its result must outlive the later statements
    check = metadata.check_later(level_cur, subscription, incarnation, first_seq)
    try:
        written = statements()
        check()
    except psycopg.Error:
        result = level_cur.pgresult
        if result is not None and result.status == pq.ExecStatus.TUPLES_OK:
            check()  # GapError (from the driver's error) when the level does not match
        raise
    return written


def run_pipelined(conn: psycopg.Connection[Any], body: Callable[[psycopg.Cursor[Any]], R]) -> R:
    """``body(cursor)`` between BEGIN and COMMIT, in pipeline mode; ROLLBACK on any error.

    Not psycopg's ``conn.transaction()``: in pipeline mode its block syncs the
    pipeline on entering and on leaving, twice each (four more round trips).
    ``conn`` is in autocommit mode, so the transaction is the BEGIN sent here."""
    try:
        with conn.pipeline(), conn.cursor() as cur:
            cur.execute("BEGIN")
            result = body(cur)
            cur.execute("COMMIT")
        return result
    except BaseException:
        if not (conn.closed or conn.broken) and (
            conn.info.transaction_status != pq.TransactionStatus.IDLE
        ):
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
