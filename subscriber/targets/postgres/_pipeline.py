"""Small batches into PostgreSQL in one round trip: BEGIN to COMMIT sent at once (issue 23).

A 1-20 entry in-sync batch used to cost ~16 client round trips (the level check,
a staging COPY and a merge per table and kind, a savepoint around the fresh rows'
COPY, the level row, COMMIT: a COPY alone is two).  Three changes bring it to one:

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
psycopg's pipeline mode: BEGIN, the level row's lock and check with the session
settings in one statement (below, and ``_settings.py``; the row made first for a
batch at seq 1), the statements, ``setval`` of the sequences, the level row's update
and COMMIT are sent without waiting, and the results are read once, when the
pipeline ends: one round trip (the first time a table is written, reading its owned
sequences adds one).  BEGIN and COMMIT are sent as
statements (:func:`run_pipelined`): psycopg's ``transaction()`` block syncs the
pipeline four times more.  Once nothing in the batch reads a result first (every
table's owned sequences known), the statements are queued and handed to libpq at
once instead of through psycopg's cursor, one statement at a time (``_queued.py``).

**The level locked and checked by the server in one statement**
(:func:`level_guarded`).  Right after BEGIN, one statement locks the level row and
divides by zero unless the row it locked holds ``first_seq - 1`` and the batch's
incarnation (or none yet; and, for a target known to be no node, unless no node
table exists: ``subscriber/targets/nodewatch.py``)::

    WITH locked AS (SELECT level, incarnation FROM txrepl_subscriptions
                    WHERE subscription = <subscription> FOR UPDATE)
    SELECT 1 / count(*)::int FROM locked
     WHERE level = <first_seq - 1> AND incarnation IN ('', <incarnation>)

Why that is the check, under READ COMMITTED.  The CTE holds ``FOR UPDATE``, so it is
never inlined (its plan is ``LockRows`` over the index scan, materialised); the outer
query compares what ``LockRows`` returned, after the lock was taken.  A second
applier's scan may read a version that a first applier is replacing: ``LockRows``
waits for that transaction; when it commits an update, ``LockRows`` re-reads the row's
latest version (EvalPlanQual: the scan re-run on it, its ``WHERE subscription = ...``
rechecked) and returns that version, or no row when it was deleted.  So the level
compared is the locked, latest one, never a snapshot's older one: a second applier
waits at the lock and then fails on the level the first one committed, before any of
its rows is written; an operator's change of the row, committed while the batch
waited or before, is what the batch compares.  The aggregate always returns one row:
no level row (never made, or deleted) counts zero and fails too, so an absent row
can never let a batch through.  Hence the row is made (``INSERT ... ON CONFLICT DO
NOTHING``, before the lock) only for a batch starting at seq 1, the one a fresh
subscription (level 0, no row) may apply; for any other, a missing row is level 0,
a gap, and the guard refuses it.  (Tested by two appliers and by an operator's
update and delete, while a batch waits: ``test_apply_pg_pipeline.py``.)

When the guard fails, the server skips every later statement of the pipeline until
its sync, COMMIT included: nothing is written, nothing committed, and the
transaction is rolled back.  The guard runs before any row statement, so a batch
that both mismatches and would fail on a row reports the gap, never a row error
that would send the entry to the error queue.  The failed statement returns no row,
so the client tells its failure from a row's by the guard's own result (not
``TUPLES_OK``) and the error's SQLSTATE (``22012``: nothing sent before it divides),
then reads the level back after the rollback: :class:`GapError` when it is not
the one the batch follows, else :class:`NodeAppeared` if a node table appeared,
else a :class:`GapError` saying the row changed (the session restarts from the
level read then; never a row error).  Rejected: the lock and the guard as two
statements (the previous way: the lock's row read back, one more statement per
batch); reading the level back before sending COMMIT (two round trips, the row
locks held across the second); a function installed in every target to raise on a
mismatch (an object to install and upgrade; the division needs none).
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
from subscriber.apply._plain import arrow_column
from subscriber.apply.writer import RowsStep, Step, check_level
from subscriber.targets.conflicts import ConflictGuard
from subscriber.targets.metadata import MetadataSql
from subscriber.targets.postgres._copy import pg_column, upsert_sql
from subscriber.targets.postgres._names import table_sql
from subscriber.targets.postgres._queued import Queued

__all__ = [
    "SMALL_PARAMS",
    "Guarded",
    "level_guarded",
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
    deletes, upserts = step.counts()
    return bool(upserts * columns <= limit and deletes * keys <= limit)


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


_STRING = pa.string()


def _texts(rows: pa.Table, schema: pb.TableSchema, indexes: list[int]) -> list[Any]:
    """The cells of columns ``indexes`` as COPY's text (None for NULL), row by row.
    (The table's names read once, and no cast of a column that is text already: for
    the few rows of an in-sync step their per-call costs were most of this.)"""
    names = rows.column_names
    columns = []
    for i in indexes:
        columns.append(_as_text(pg_column(rows, i, schema.columns[i], names)))
    return [cell for row in zip(*columns, strict=True) for cell in row]


def _as_text(col: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A COPY-ready column's cells as text (no cast of a column that is text already)."""
    out: list[Any] = (col if col.type == _STRING else pc.cast(col, _STRING)).to_pylist()
    return out


T = pb.ColumnType
# Types whose text is made here, as Arrow's cast to string makes it: an int64's
# decimal digits, a bool's "true"/"false", the strings as they are, bytes as
# _copy.pg_column writes them.  The others (floats: Arrow's shortest form is not
# repr's; dates and times) are formatted by Arrow from a column of the same values.
_STRINGS = (
    T.COLUMN_TYPE_TEXT,
    T.COLUMN_TYPE_JSON,
    T.COLUMN_TYPE_DECIMAL,
    T.COLUMN_TYPE_TIMESTAMPTZ,
)
_AS_TEXT = frozenset(map(int, _STRINGS))
_INTEGER = int(T.COLUMN_TYPE_INTEGER)
_BOOLEAN = int(T.COLUMN_TYPE_BOOLEAN)
_BYTES = int(T.COLUMN_TYPE_BYTES)


def _plain_text(values: list[Any], column: pb.Column, i: int) -> list[Any]:
    """What :func:`_texts` makes of column ``i`` holding ``values`` (``to_pylist`` form)."""
    t = column.type
    if t in _AS_TEXT:
        return values
    if t == _INTEGER:
        return [None if v is None else str(v) for v in values]
    if t == _BOOLEAN:
        return [None if v is None else ("true" if v else "false") for v in values]
    if t == _BYTES:
        return [None if v is None else "\\x" + v.hex() for v in values]
    name = f"c{i}"
    table = pa.Table.from_arrays([arrow_column(column, values)], [name])
    return _as_text(pg_column(table, i, column, [name]))


def plain_texts(columns: list[list[Any]], schema: pb.TableSchema, indexes: list[int]) -> list[Any]:
    """:func:`_texts` of the plain values of columns ``indexes`` (``RowsStep.columns``)."""
    texts = [_plain_text(v, schema.columns[i], i) for v, i in zip(columns, indexes, strict=True)]
    return [cell for row in zip(*texts, strict=True) for cell in row]


def _tuples(count: int, width: int) -> sql.Composed:
    one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() for _ in range(width)))
    return sql.SQL(", ").join([one] * count)


# The statements of a rows step, rendered once per shape (the table's schema, the
# number of deletes and of upserts): composing them with psycopg.sql cost more of an
# in-sync batch's CPU than sending them.  Bounded: emptied when full.
_RENDERED: dict[tuple[bytes, int, int], tuple[bytes | None, bytes | None]] = {}
_RENDERED_MAX = 1024


def _statements(
    cur: psycopg.Cursor[Any] | Queued, schema: pb.TableSchema, deletes: int, upserts: int
) -> tuple[bytes | None, bytes | None]:
    """(DELETE, INSERT ... ON CONFLICT) of a rows step of this shape, as sent."""
    key = (schema.SerializeToString(), deletes, upserts)
    got = _RENDERED.get(key)
    if got is not None:
        return got
    names = [c.name for c in schema.columns]
    keys = [names.index(k) for k in schema.primary_key]
    delete = upsert = None
    if deletes:
        cols = sql.SQL(", ").join(Q(names[i]) for i in keys)
        delete = (
            sql.SQL("DELETE FROM {} WHERE ({}) IN ({})")
            .format(table_sql(schema.table), cols, _tuples(deletes, len(keys)))
            .as_bytes(cur.connection)
        )
    if upserts:
        source = sql.SQL("VALUES {}").format(_tuples(upserts, len(names)))
        upsert = upsert_sql(schema, source).as_bytes(cur.connection)
    if len(_RENDERED) >= _RENDERED_MAX:
        _RENDERED.clear()
    _RENDERED[key] = (delete, upsert)
    return delete, upsert


def _step_texts(step: RowsStep, upserts: bool, indexes: list[int]) -> list[Any]:
    """:func:`_texts` of the step's upserts (else deletes), from its plain values
    when it keeps them (``subscriber/apply/_plain.py``): the same text, no Arrow
    but for the types formatted by Arrow's cast (:func:`plain_texts`)."""
    columns = step.columns(upserts, indexes)
    if columns is None:
        return _texts(step.upserts if upserts else step.deletes, step.schema, indexes)
    return plain_texts(columns, step.schema, indexes)


def rows_by_statements(cur: psycopg.Cursor[Any] | Queued, step: RowsStep) -> int:
    """Write a small rows step: one DELETE, one INSERT ... ON CONFLICT (no fetch)."""
    schema = step.schema
    deletes, upserts = step.counts()
    delete, upsert = _statements(cur, schema, deletes, upserts)
    if delete is not None:
        keys = [[c.name for c in schema.columns].index(k) for k in schema.primary_key]
        cur.execute(delete, _step_texts(step, False, keys))
    if upsert is not None:
        cur.execute(upsert, _step_texts(step, True, list(range(len(schema.columns)))))
    return deletes + upserts


# Locks the level row and fails (division by zero) unless the row it locked is the
# one the batch follows (and, for a target known to be no node, unless it still has
# no node table: subscriber/targets/nodewatch.py): module docstring.
_GUARD = (
    "WITH locked AS (SELECT level, incarnation FROM txrepl_subscriptions"
    " WHERE subscription = %(subscription)s FOR UPDATE)"
    " SELECT 1 / count(*)::int{settings} FROM locked"
    " WHERE level = %(level)s AND incarnation IN ('', %(incarnation)s)"
    " AND (NOT %(nodeless)s OR to_regclass('txrepl_node') IS NULL)"
)
_DIVISION_BY_ZERO = "22012"


class Guarded:
    """A pipelined batch's level guard, sent (:func:`level_guarded`); asked after the
    batch failed whether the guard is what failed, and why (module docstring)."""

    def __init__(self, result: Any, metadata: MetadataSql, batch: tuple[str, str, int]) -> None:
        self._result = result  # the guard's cursor or Handle (its pgresult)
        self._metadata = metadata
        self.batch = batch

    def failed(self, error: BaseException | None) -> bool:
        """Whether the guard failed (``error``: the driver's error the batch raised):
        its result is not a row, and the error is its division (nothing sent before it
        divides: BEGIN, the settings, the level row's INSERT)."""
        result = self._result.pgresult
        if result is not None and result.status == pq.ExecStatus.TUPLES_OK:
            return False  # it passed: a later statement failed
        return isinstance(error, psycopg.Error) and error.sqlstate == _DIVISION_BY_ZERO

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """After the rollback: :class:`GapError` if the level read now is not the one
        the batch follows."""
        subscription, incarnation, first_seq = self.batch
        with conn.cursor() as cur:
            level, stored = self._metadata.read_level(cur, subscription)
        check_level(subscription, incarnation, first_seq, level, stored)


def level_guarded(
    cur: psycopg.Cursor[Any] | Queued,
    metadata: MetadataSql,
    batch: tuple[str, str, int],
    *,
    nodeless: bool = False,
    settings: tuple[str, Sequence[Any]] = ("", ()),
) -> Guarded:
    """Lock the level row and send the server's check of it, in one statement (module
    docstring); ``batch``: (subscription, incarnation, first_seq); ``nodeless``: the
    check fails too if a node table exists; ``settings``: more ``set_config`` calls
    for the same statement (", set_config(%(p0)s, ...)" and their values: the
    session's settings, taken once the guard passed).  Returns the :class:`Guarded`
    to ask when the transaction failed."""
    subscription, incarnation, first_seq = batch
    if first_seq == 1:  # the one batch an absent row (level 0) may let through
        metadata.make_row(cur, subscription)
    fields, values = settings
    params: dict[str, Any] = {f"p{i}": v for i, v in enumerate(values)}
    params.update(
        level=first_seq - 1, incarnation=incarnation, nodeless=nodeless, subscription=subscription
    )
    query = _GUARD.replace("{settings}", fields)
    if isinstance(cur, Queued):  # each statement has its own result (_queued.py)
        return Guarded(cur.execute(query, params), metadata, batch)
    guard_cur = cur.connection.cursor()  # its result must outlive the later statements
    guard_cur.execute(query, params)
    return Guarded(guard_cur, metadata, batch)


def run_pipelined(
    conn: psycopg.Connection[Any],
    body: Callable[[Any], R],
    after: str | None = None,
    *,
    queued: bool = False,
) -> tuple[R, tuple[Any, ...] | None]:
    """``body(cursor)`` between BEGIN and COMMIT, in pipeline mode; ROLLBACK on any error.

    ``after``: a statement sent right after COMMIT, in the same round trip (the
    commit's LSN, ``_durable.py``); returns (``body``'s result, its row or None).
    Not psycopg's ``conn.transaction()``: in pipeline mode its block syncs the
    pipeline on entering and on leaving, twice each (four more round trips).
    ``conn`` is in autocommit mode, so the transaction is the BEGIN sent here.
    ``queued``: the statements are queued and sent at once (``_queued.py``; ``body``
    then gets a :class:`Queued`, which reads no result before the end)."""
    try:
        if queued:
            q = Queued(conn)
            q.execute("BEGIN")
            result = body(q)
            q.execute("COMMIT")
            lsns = q.execute(after) if after is not None else None
            q.run()
            return result, (lsns.fetchone() if lsns is not None else None)
        after_cur = conn.cursor()  # read once the pipeline ended (fetching syncs it)
        with conn.pipeline(), conn.cursor() as cur:
            cur.execute("BEGIN")
            result = body(cur)
            cur.execute("COMMIT")
            if after is not None:
                after_cur.execute(after)
        row = after_cur.fetchone() if after is not None else None
        after_cur.close()
        return result, row
    except BaseException:
        if not (conn.closed or conn.broken) and (
            conn.info.transaction_status != pq.TransactionStatus.IDLE
        ):
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
