"""SQLite target writer: stdlib ``sqlite3``, one ``BEGIN IMMEDIATE`` transaction per batch.

Type mapping (logical -> SQLite declared type, stored value):

===========  ========  ==============================================
INTEGER      INTEGER   integer
DECIMAL      TEXT      exact decimal text, positional (never REAL)
FLOAT        REAL      double; NaN as TEXT 'NaN' (SQLite binds it as NULL);
                       -0.0 becomes 0.0 (a REAL column cannot hold it)
TEXT         TEXT      text
BYTES        BLOB      bytes
BOOLEAN      INTEGER   0 / 1
DATE         TEXT      ISO 8601 ``YYYY-MM-DD``
TIME         TEXT      ISO 8601 ``HH:MM:SS[.ffffff]``
TIMESTAMP    TEXT      ISO 8601 ``YYYY-MM-DDTHH:MM:SS[.ffffff]``
TIMESTAMPTZ  TEXT      ISO 8601 with offset ``...+HH:MM``
JSON         TEXT      the JSON document's text
other        (none)    the value's natural SQLite form
===========  ========  ==============================================

A SQLite source's tables get the source's own declared types instead (``declared``),
and its values arrive as they were stored: every value keeps its storage class, TEXT
that is not UTF-8 included (docs/types.md).

Replicated changes do not fire the target's own triggers (``triggers.py``: the
replica role of SQLite targets, with a ``txrepl:always`` opt-out per trigger).

The database runs in WAL mode with ``synchronous=FULL``: a commit that returned
survives a crash or power loss.
"""

from __future__ import annotations

import datetime as dt
import decimal
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from common import values
from common.names import parse_table, quote_ident
from common.origin import ensure_applying
from common.rpc import txrepl_pb2 as pb
from subscriber.apply._plain import arrow_column
from subscriber.apply.errors import ApplyError, TransientError, WriterError
from subscriber.apply.writer import (
    CallStep,
    HistoryStep,
    RowsStep,
    SchemaStep,
    SqlStep,
    Step,
    SubscriptionState,
    TruncateStep,
    column_of,
    python_values,
)
from subscriber.targets.conflicts import ConflictGuard, guarded_rows
from subscriber.targets.error_queue import ErrorQueue
from subscriber.targets.held import Held, HeldWrites
from subscriber.targets.metadata import MetadataSql
from subscriber.targets.nodewatch import NodeWatch
from subscriber.targets.procedures import Procedure, load_procedures
from subscriber.targets.sqlite._constraints import SqliteOrderedTables, refused_row
from subscriber.targets.sqlite._ddl import follow_clauses, follow_indexes, table_clauses
from subscriber.targets.sqlite._truncate import empty_table
from subscriber.targets.sqlite.triggers import TriggerGuard

__all__ = [
    "DECLARED",
    "METADATA",
    "SqliteWriter",
    "declared",
    "placed_params",
    "quote",
    "sqlite_value",
]

T = pb.ColumnType

DECLARED: dict[int, str] = {
    T.COLUMN_TYPE_INTEGER: "INTEGER",
    T.COLUMN_TYPE_DECIMAL: "TEXT",
    T.COLUMN_TYPE_FLOAT: "REAL",
    T.COLUMN_TYPE_TEXT: "TEXT",
    T.COLUMN_TYPE_BYTES: "BLOB",
    T.COLUMN_TYPE_BOOLEAN: "INTEGER",
    T.COLUMN_TYPE_DATE: "TEXT",
    T.COLUMN_TYPE_TIME: "TEXT",
    T.COLUMN_TYPE_TIMESTAMP: "TEXT",
    T.COLUMN_TYPE_TIMESTAMPTZ: "TEXT",
    T.COLUMN_TYPE_JSON: "TEXT",
}


def declared(column: pb.Column, schema: pb.TableSchema) -> str:
    """The declared type a target column gets: a SQLite source's own (the same affinity,
    so every value keeps its storage class), else that of its logical type."""
    if schema.source_dialect == "sqlite":
        return column.source_type
    return DECLARED.get(column.type, "")


METADATA = """
CREATE TABLE IF NOT EXISTS txrepl_subscriptions (
    subscription TEXT PRIMARY KEY,
    incarnation  TEXT NOT NULL,
    level        INTEGER NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS txrepl_schemas (
    subscription TEXT NOT NULL,
    table_name   TEXT NOT NULL,
    schema       BLOB NOT NULL,   -- serialized txrepl.v1.TableSchema
    updated_at   TEXT NOT NULL,
    PRIMARY KEY (subscription, table_name)
);
CREATE TABLE IF NOT EXISTS txrepl_errors (
    subscription TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    entry        BLOB NOT NULL,   -- serialized txrepl.v1.Entry, whole
    error        TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'open',  -- open | skipped | applied
    PRIMARY KEY (subscription, seq)
);
-- one row only inside the writer's batch transaction: the target's triggers skip
-- replicated changes (triggers.py)
CREATE TABLE IF NOT EXISTS txrepl_applying (since TEXT NOT NULL);
"""


quote = quote_ident


def quote_table(table: str) -> str:
    """The SQLite table of wire table ``table`` (common/names.py), quoted: SQLite has no
    schemas, so ``schema.name`` is one table of that name (docs/apply.md, "Names")."""
    return quote_ident(parse_table(table).flat)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


# The metadata statements (subscriber/targets/metadata.py) as SQLite spells them;
# BEGIN IMMEDIATE holds the write lock, so the level row needs no lock of its own.
METADATA_SQL = MetadataSql(mark=":{}", now=":now", now_value=_now)


def _real(v: float) -> float | str:
    """A double as stored: SQLite binds a NaN as NULL, so it is stored as the TEXT
    ``'NaN'`` (a REAL column keeps text that is not a number).  A -0.0 cannot be kept
    (a REAL column stores 0.0, and converts the text ``'-0.0'`` too): docs/types.md."""
    return "NaN" if v != v else v


def _decimal(text: str) -> str:
    """A decimal's text as stored: positional, as PostgreSQL writes it (``-1E-36`` is
    ``-0.000000000000000000000000000000000001``)."""
    return format(decimal.Decimal(text), "f") if "E" in text else text


def sqlite_value(v: object) -> object:
    """A Python value of ``common.values`` in the form this writer stores."""
    if isinstance(v, float):
        return _real(v)
    if v is None or isinstance(v, int | str | bytes):
        return int(v) if isinstance(v, bool) else v
    if isinstance(v, decimal.Decimal):
        return _decimal(str(v))
    if isinstance(v, dt.date | dt.time):  # datetime is a date
        return v.isoformat()
    raise TypeError(f"no SQLite form for {type(v).__name__}")


# Plain ints, read once: a protobuf enum's attribute costs ~1 us a read, and these
# are read per column of every batch.
_FLOAT = int(T.COLUMN_TYPE_FLOAT)
_DECIMAL = int(T.COLUMN_TYPE_DECIMAL)
_BOOLEAN = int(T.COLUMN_TYPE_BOOLEAN)
# Already in stored form (timestamptz travels as ISO text).
_AS_IS = frozenset(
    int(t)
    for t in (
        T.COLUMN_TYPE_INTEGER,
        T.COLUMN_TYPE_TEXT,
        T.COLUMN_TYPE_JSON,
        T.COLUMN_TYPE_BYTES,
        T.COLUMN_TYPE_TIMESTAMPTZ,
    )
)


def _column_values(
    table: pa.Table, index: int, column: pb.Column, names: frozenset[str] | None = None
) -> list[object]:
    """Column ``index`` of an apply table as bound (``names``: the table's column
    names, when the caller reads several columns of it)."""
    col, variant = column_of(table, index, names)
    if variant:
        return [sqlite_value(v) for v in python_values(col, column, variant)]
    return _bound(column, col.to_pylist, lambda: col)


def _bound(
    column: pb.Column, cells: Callable[[], list[Any]], arrow: Callable[[], pa.ChunkedArray]
) -> list[object]:
    """A column's values as bound, from its cells in ``to_pylist`` form (``cells()``);
    the types stored in another form than Python's (dates and times) from its Arrow
    column (``arrow()``).  Read only as the type needs: one of the two is built."""
    t = column.type
    if t in _AS_IS:
        out: list[object] = cells()
        return out
    if t == _FLOAT:
        return [None if v is None else _real(v) for v in cells()]
    if t == _DECIMAL:
        return [None if v is None else _decimal(v) for v in cells()]
    if t == _BOOLEAN:
        return [None if b is None else int(b) for b in cells()]
    return [sqlite_value(v) for v in python_values(arrow(), column, False)]


def _step_values(step: RowsStep, upserts: bool, indexes: list[int]) -> list[list[object]]:
    """:func:`_column_values` of the step's upserts (else deletes), from its plain
    values when it keeps them (``subscriber/apply/_plain.py``): each list is what the
    Arrow column's ``to_pylist`` gives, so the same branches apply."""
    schema = step.schema
    plain = step.columns(upserts, indexes)
    if plain is None:
        rows = step.upserts if upserts else step.deletes
        have = frozenset(rows.column_names)
        return [_column_values(rows, i, schema.columns[i], have) for i in indexes]

    def bound(cells: list[Any], column: pb.Column) -> list[object]:
        return _bound(
            column, lambda: cells, lambda: pa.chunked_array([arrow_column(column, cells)])
        )

    return [bound(cells, schema.columns[i]) for cells, i in zip(plain, indexes, strict=True)]


class SqliteWriter(HeldWrites, ErrorQueue, SqliteOrderedTables):
    """Writes batches into one SQLite database file (thread-safe; one connection)."""

    dialect = "sqlite"
    _metadata = METADATA_SQL  # the txrepl_errors methods: subscriber/targets/error_queue.py

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 30.0,
        procedures: Mapping[str, Procedure] | None = None,
    ) -> None:
        self.path = Path(path)
        self._procedures = load_procedures(procedures)
        try:
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            # Foreign keys are the source's business (the replica role: _order.py).
            self._conn.execute("PRAGMA foreign_keys=OFF")
            self._conn.executescript(METADATA)
            ensure_applying(self._conn)  # with the origin the capture reads (common/origin.py)
            cols = [r[1] for r in self._conn.execute("PRAGMA table_info(txrepl_errors)")]
            if "status" not in cols:  # made by an earlier build
                self._conn.execute(
                    "ALTER TABLE txrepl_errors ADD COLUMN status TEXT NOT NULL DEFAULT 'open'"
                )
        except sqlite3.Error as exc:
            raise WriterError(f"cannot open SQLite target {self.path}: {exc}") from exc
        self._lock = threading.Lock()
        self._guard = TriggerGuard()
        self._held = Held()  # a group applied in pieces (subscriber/targets/held.py)
        self._nodes = NodeWatch("sqlite")  # the target's node (subscriber/targets/nodewatch.py)
        self.apply_origin = ""  # the node the next batch's changes come from (engine sets)
        self.conflicts: ConflictGuard | None = None  # updatable subscriptions' checks

    @property
    def node(self) -> str:
        """The node this target is, as its publisher recorded it ("" if none; known
        absent, checked in each batch's transaction instead: nodewatch.py)."""
        with self._lock:
            return self._nodes.read(self._conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def load_state(self, subscription: str) -> SubscriptionState:
        with self._lock:
            state: SubscriptionState = self._read(
                lambda conn: METADATA_SQL.load_state(conn, subscription), subscription
            )
            return state

    def _read(self, body: Any, subscription: str | None = None) -> Any:
        """``body(connection)`` outside a transaction (the lock held); translated errors."""
        try:
            return body(self._conn)
        except sqlite3.Error as exc:
            raise WriterError(
                f"cannot read the txrepl tables of {self.path}: {exc}",
                subscription=subscription or "",
            ) from exc

    def write_held(
        self,
        subscription: str,
        incarnation: str,
        first_seq: int,
        last_seq: int,
        steps: Sequence[Step],
        *,
        commit: bool,
        reexecute: bool = False,
    ) -> int:
        """:meth:`write`, or (``commit=False``) a piece of a group left uncommitted
        (subscriber/targets/held.py): one ``BEGIN IMMEDIATE`` spans the pieces."""
        with self._lock:
            conn = self._conn
            try:
                if self._held.open:
                    self._held.check(subscription, first_seq)
                else:
                    conn.execute("BEGIN IMMEDIATE")
                    if not reexecute:  # under the write lock: no node recorded meanwhile
                        self._nodes.check(conn, subscription, first_seq)
                    METADATA_SQL.open_batch(conn, subscription, incarnation, first_seq, reexecute)
                    self._guard.ensure(conn)
                    conn.execute(
                        "INSERT INTO txrepl_applying (since, origin) VALUES (?, ?)",
                        (_now(), self.apply_origin or None),
                    )
                written = 0
                for step in steps:
                    written += self._step(subscription, step)
                if not commit:
                    self._held.hold(subscription, last_seq)
                    return written
                self._held.clear()
                self._guard.ensure(conn)  # a replicated schema op or SQL may add triggers
                conn.execute("DELETE FROM txrepl_applying")
                seqs = (first_seq, last_seq)
                METADATA_SQL.close_batch(conn, subscription, incarnation, seqs, reexecute)
                conn.execute("COMMIT")
                if self.conflicts is not None:
                    self.conflicts.committed()
                return written
            except BaseException as exc:
                if self.conflicts is not None:
                    self.conflicts.rolled_back()
                self._held.clear()
                self._guard.forget()
                self._fail(exc, subscription, first_seq)
                raise

    def abandon(self) -> None:
        """Roll back a group's held transaction, if one is open."""
        with self._lock:
            if self._held.open:
                if self.conflicts is not None:
                    self.conflicts.rolled_back()
                self._held.clear()
                self._guard.forget()
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    def _fail(self, exc: BaseException, subscription: str, seq: int | None) -> None:
        """Roll back; translate a driver error (the caller re-raises anything else)."""
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            cls = (
                TransientError
                if isinstance(exc, sqlite3.OperationalError)
                and ("locked" in str(exc) or "busy" in str(exc))
                else WriterError
            )
            raise cls(
                f"SQLite target {self.path} refused the batch: {exc}",
                subscription=subscription,
                seq=seq,
            ) from exc

    def _in_transaction(self, subscription: str, seq: int, body: Any) -> Any:
        """``body(connection)`` in one ``BEGIN IMMEDIATE`` transaction; translated errors."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                result = body(self._conn)
                self._conn.execute("COMMIT")
                return result
            except BaseException as exc:
                self._fail(exc, subscription, seq)
                raise

    # -- steps ---------------------------------------------------------------

    def _step(self, subscription: str, step: Step) -> int:
        if isinstance(step, RowsStep):
            return guarded_rows(self.conflicts, self._conn, subscription, step, self._rows)
        if isinstance(step, HistoryStep):
            return self._history(step)
        if isinstance(step, SchemaStep):
            self._schema(subscription, step.schema, step.target or step.schema, step.previous)
            return 0
        if isinstance(step, TruncateStep):
            empty_table(self._conn, step)
            return 0
        if isinstance(step, SqlStep):
            self._conn.execute(step.sql)
            return 0
        if isinstance(step, CallStep) and step.name in self._procedures:
            args = [values.decode(v) for v in step.args]
            self._procedures[step.name](self._conn, *args)
            return 0
        if isinstance(step, CallStep):
            raise ApplyError(
                f"procedure call {step.name!r}: a SQLite target has no procedures "
                "(no Python handler is registered)",
                subscription=subscription,
            )
        raise AssertionError(f"unknown step {step!r}")

    def _existing_columns(self, table: str) -> list[str]:
        return [r[1] for r in self._conn.execute(f"PRAGMA table_info({quote_table(table)})")]

    def _schema(
        self,
        subscription: str,
        source: pb.TableSchema,
        schema: pb.TableSchema,
        previous: pb.TableSchema | None,
    ) -> None:
        existing = self._existing_columns(schema.table)
        if not existing:
            cols = []
            for c in schema.columns:
                decl = declared(c, schema)
                null = "" if c.nullable or c.name in schema.primary_key else " NOT NULL"
                cols.append(f"{quote(c.name)} {decl}{null}".rstrip())
            cols.append(f"PRIMARY KEY ({', '.join(quote(k) for k in schema.primary_key)})")
            cols.extend(table_clauses(schema) if schema is source else [])
            self._conn.execute(f"CREATE TABLE {quote_table(schema.table)} ({', '.join(cols)})")
        else:
            have = {n.lower() for n in existing}
            for c in schema.columns:
                if c.name.lower() not in have:
                    # SQLite cannot add a NOT NULL column without a default: added columns
                    # are nullable on the target (the source's rows fill them).
                    decl = declared(c, schema)
                    self._conn.execute(
                        f"ALTER TABLE {quote_table(schema.table)} ADD COLUMN {quote(c.name)} {decl}"
                    )
            if previous is not None and schema is source:
                self._drop_columns(schema, previous, have)
        if schema is source:  # a shaped table's columns are not the source's
            if existing and previous is not None:
                follow_clauses(self._conn, schema, previous, parse_table(schema.table).flat)
            follow_indexes(
                self._conn, schema, previous if existing else None, quote_table(schema.table)
            )
        METADATA_SQL.record_schema(self._conn, subscription, source)

    def _drop_columns(
        self, schema: pb.TableSchema, previous: pb.TableSchema, have: set[str]
    ) -> None:
        """Drop the columns the source dropped (or renamed: the new name was added).

        Only columns the previous source schema had: a column the operator added
        to the target stays.  A shaped target (transforms, history) keeps its
        columns.
        """
        now = {c.name.lower() for c in schema.columns}
        for c in previous.columns:
            if c.name.lower() in now or c.name.lower() not in have:
                continue
            try:
                table = quote_table(schema.table)
                self._conn.execute(f"ALTER TABLE {table} DROP COLUMN {quote(c.name)}")
            except sqlite3.OperationalError as exc:
                raise WriterError(
                    f"the source dropped column {c.name!r} of table {schema.table!r} but the "
                    f"SQLite target {self.path} cannot ({exc}): drop what uses the column on "
                    "the target (index, view, trigger), then `txrepl subscriber errors retry`"
                ) from exc

    def _rows(self, step: RowsStep) -> int:
        schema = step.schema
        names = [c.name for c in schema.columns]
        table = quote_table(schema.table)
        written = 0
        deletes, upserts = step.counts()
        if deletes:
            key_idx = [names.index(k) for k in schema.primary_key]
            marks, cols = placed_params(_step_values(step, False, key_idx))
            where = " AND ".join(
                f"{quote(names[i])} IS {m}" for i, m in zip(key_idx, marks, strict=True)
            )
            self._conn.executemany(f"DELETE FROM {table} WHERE {where}", _rows_of(cols))
            written += deletes
        if upserts:
            placed, cols = placed_params(_step_values(step, True, list(range(len(names)))))
            collist = ", ".join(quote(n) for n in names)
            row = ", ".join(placed)
            pk = ", ".join(quote(k) for k in schema.primary_key)
            rest = [n for n in names if n not in schema.primary_key]
            if rest:
                sets = ", ".join(f"{quote(n)} = excluded.{quote(n)}" for n in rest)
                conflict = f"DO UPDATE SET {sets}"
            else:
                conflict = "DO NOTHING"
            upsert = f"INSERT INTO {table} ({collist}) VALUES ({row}) ON CONFLICT ({pk}) {conflict}"
            try:
                self._conn.executemany(upsert, _rows_of(cols))
            except sqlite3.IntegrityError as exc:  # name the row (a target-only constraint)
                refused = refused_row(
                    self._conn,
                    schema.table,
                    upsert,
                    _rows_of(cols),
                    names,
                    list(schema.primary_key),
                )
                raise WriterError(
                    f"SQLite target {self.path} refused the batch: {exc} (table "
                    f"{schema.table!r}, {refused}): a constraint the source does not have?"
                ) from exc
            written += upserts
        return written

    def _history(self, step: HistoryStep) -> int:
        schema, versions = step.schema, step.versions
        names = [c.name for c in schema.columns]
        close, insert = _history_sql(schema)
        firsts = versions.filter(versions.column("_first"))
        order = [names.index("_first_seq")] + [names.index(k) for k in schema.primary_key[:-1]]
        cols = [_column_values(firsts, i, schema.columns[i]) for i in order]
        self._conn.executemany(close, _rows_of(cols))
        cols = [_column_values(versions, i, c) for i, c in enumerate(schema.columns)]
        self._conn.executemany(insert, _rows_of(cols))
        return int(versions.num_rows)


def _history_sql(schema: pb.TableSchema) -> tuple[str, str]:
    """(close the open version of a key, insert a version) for a history table."""
    table = quote_table(schema.table)
    keys = list(schema.primary_key[:-1])
    where = " AND ".join(f"{quote(k)} IS ?" for k in keys)
    close = f'UPDATE {table} SET "_last_seq" = ? - 1 WHERE {where} AND "_last_seq" IS NULL'
    names = [c.name for c in schema.columns]
    marks = ", ".join("?" for _ in names)
    insert = f"INSERT INTO {table} ({', '.join(quote(n) for n in names)}) VALUES ({marks})"
    return close, insert


# TEXT that is not UTF-8 (common.values.RawText) can only be bound as a BLOB: a column
# holding some in this batch binds (is raw text, value, value) and casts those back.
_RAW_MARK = "CASE WHEN ? THEN CAST(? AS TEXT) ELSE ? END"


def placed_params(columns: list[list[object]]) -> tuple[list[str], list[list[object]]]:
    """The placeholder of each column and the parameter columns it binds."""
    marks: list[str] = []
    params: list[list[object]] = []
    for cells in columns:
        if any(isinstance(v, values.RawText) for v in cells):
            marks.append(_RAW_MARK)
            params += [[isinstance(v, values.RawText) for v in cells], cells, cells]
        else:
            marks.append("?")
            params.append(cells)
    return marks, params


def _rows_of(columns: list[list[object]]) -> Iterable[tuple[object, ...]]:
    return zip(*columns, strict=True)
