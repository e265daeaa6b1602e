"""MariaDB / MySQL target writer: PyMySQL, one InnoDB transaction per batch.

A batch::

    DDL the batch needs that only adds        CREATE TABLE IF NOT EXISTS, ADD COLUMN
                                              (autocommit, before the transaction)
    BEGIN
    INSERT IGNORE level row; SELECT ... FOR UPDATE   -- the level lock: a second
                                                     -- applier waits, then fails
    per step, in order:
      rows      DELETE FROM t WHERE (key) IN ((...), ...)
                INSERT INTO t (...) VALUES (...), ... ON DUPLICATE KEY UPDATE c = VALUES(c)
      history   UPDATE t SET _last_seq = ... ; INSERT INTO t ...
      schema    upsert txrepl_schemas
      truncate  DELETE FROM t (TRUNCATE would commit)
      sql       the statement
      call      a Python handler, or CALL name(args)
    INSERT txrepl_pending_drops: the columns the source dropped
    UPDATE the level row
    COMMIT
    DROP COLUMN of each pending drop, then DELETE its row  (autocommit, after the commit)

**Why DDL runs outside the transaction.**  MariaDB commits implicitly before and
after every DDL statement, so a CREATE or ALTER inside the batch's transaction would
commit the rows before it without the level: a crash then would apply them twice
(exactly-once lost for anything not idempotent: a replicated ``UPDATE ... SET n =
n + 1``, a procedure call).  Instead the DDL a batch needs is split by what it does:

* what only **adds** (a new table, new columns) runs first, each statement on its
  own.  A crash after it leaves extra tables or columns and the level where it was;
  the batch is applied again and its additive DDL finds them there (``IF NOT
  EXISTS``, "columns it lacks"): nothing else of the target changed.  The rows steps
  before a schema step in the batch write only the columns they know; the new ones
  are NULL for them, as they were on the source.
* what **removes** (columns the source dropped) is owed: the batch's transaction
  records it in ``txrepl_pending_drops`` with the level, and it runs after the
  commit.  A crash between the two leaves the column on the target (NULL in the
  rows written since) and the row that owes its drop: the writer's next start drops
  it.  A drop of a column already gone is skipped, so each happens once.  Because
  the column may outlive the schema that dropped it for a while, every non-key
  column is created NULL-able: NOT NULL is the source's business here, as CHECK
  constraints are.
* A schema step in a later piece of a group held open across pieces
  (subscriber/targets/held.py) cannot run its DDL without committing the group:
  such a piece is refused with one line (raise ``[batch]`` limits).

Replicated SQL statements (``SqlStep``) run inside the transaction as they come: one
that is DDL commits early on MariaDB (docs/apply.md, "MariaDB").

Triggers fire for replicated rows (MariaDB has no replica role); the apply session
sets ``@txrepl_applying = 1`` for triggers to test (``_conn.py``).  Foreign keys are
not checked (``foreign_key_checks = 0``), and tables with secondary unique indexes
take the constraint-safe order (``ordered_tables``, subscriber/apply/_order.py).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pymysql

from common import values
from common.rpc import txrepl_pb2 as pb
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
)
from subscriber.targets.error_queue import ErrorQueue
from subscriber.targets.held import Held, HeldWrites
from subscriber.targets.mariadb._conn import Executor, connect, is_transient
from subscriber.targets.mariadb._types import (
    check_schema,
    column_sql,
    column_values,
    quote,
    quote_table,
)
from subscriber.targets.metadata import MetadataSql
from subscriber.targets.procedures import Procedure, load_procedures

__all__ = ["METADATA", "METADATA_SQL", "MariaWriter", "create_table_sql"]

_TEXT = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
METADATA = [
    f"""CREATE TABLE IF NOT EXISTS txrepl_subscriptions (
    subscription {_TEXT} PRIMARY KEY,
    incarnation  {_TEXT} NOT NULL,
    level        BIGINT NOT NULL,
    updated_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB""",
    f"""CREATE TABLE IF NOT EXISTS txrepl_schemas (
    subscription {_TEXT} NOT NULL,
    table_name   {_TEXT} NOT NULL,
    "schema"     LONGBLOB NOT NULL,
    updated_at   DATETIME(6) NOT NULL,
    PRIMARY KEY (subscription, table_name)
) ENGINE=InnoDB""",
    f"""CREATE TABLE IF NOT EXISTS txrepl_errors (
    subscription {_TEXT} NOT NULL,
    seq          BIGINT NOT NULL,
    entry        LONGBLOB NOT NULL,
    error        LONGTEXT NOT NULL,
    created_at   DATETIME(6) NOT NULL,
    status       VARCHAR(16) NOT NULL DEFAULT 'open',
    PRIMARY KEY (subscription, seq)
) ENGINE=InnoDB""",
    # DROP COLUMNs a committed batch owes (written in its transaction, done after it)
    f"""CREATE TABLE IF NOT EXISTS txrepl_pending_drops (
    table_name   {_TEXT} NOT NULL,
    column_name  {_TEXT} NOT NULL,
    PRIMARY KEY (table_name, column_name)
) ENGINE=InnoDB""",
]


def _rewrite(text: str) -> str:
    """PostgreSQL's spelling of the metadata statements (targets/metadata.py) as MariaDB's."""
    if re.search(r"ON CONFLICT \([^)]*\) DO NOTHING", text):
        text = re.sub(r"\s*ON CONFLICT \([^)]*\) DO NOTHING", "", text)
        text = text.replace("INSERT INTO", "INSERT IGNORE INTO", 1)
    text = re.sub(r"ON CONFLICT \([^)]*\) DO UPDATE SET", "ON DUPLICATE KEY UPDATE", text)
    text = re.sub(r"\bexcluded\.(\w+)", r"VALUES(\1)", text)
    text = re.sub(r"(?<!%\()\bschema\b", '"schema"', text)  # a reserved word in MariaDB
    return text.replace(" AS text)", " AS CHAR)")


METADATA_SQL = MetadataSql(
    mark="%({})s",
    now="UTC_TIMESTAMP(6)",
    lock_suffix=" FOR UPDATE",
    make_level_row=True,
    rewrite=_rewrite,
)

_DELETE_CHUNK = 1000


def create_table_sql(schema: pb.TableSchema, name: str | None = None) -> str:
    """CREATE TABLE IF NOT EXISTS for ``schema`` (as ``name``, a quoted name, if given)."""
    cols = []
    for c in schema.columns:
        key = c.name in schema.primary_key
        cols.append(f"{quote(c.name)} {column_sql(c, key=key)}{' NOT NULL' if key else ''}")
    pk = ", ".join(quote(k) for k in schema.primary_key)
    table = name or quote_table(schema.table)
    return (
        f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(cols)}, PRIMARY KEY ({pk}))"
        " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin"
    )


def upsert_sql(schema: pb.TableSchema) -> str:
    names = [c.name for c in schema.columns]
    rest = [n for n in names if n not in schema.primary_key] or list(schema.primary_key[:1])
    sets = ", ".join(f"{quote(n)} = VALUES({quote(n)})" for n in rest)
    return (
        f"INSERT INTO {quote_table(schema.table)} ({', '.join(quote(n) for n in names)})"
        f" VALUES ({', '.join('%s' for _ in names)}) ON DUPLICATE KEY UPDATE {sets}"
    )


class MariaWriter(HeldWrites, ErrorQueue):
    """Writes batches into one MariaDB database (thread-safe; one connection)."""

    dialect = "mariadb"
    _metadata = METADATA_SQL  # the txrepl_errors methods: subscriber/targets/error_queue.py

    def __init__(self, url: str, *, procedures: Mapping[str, Procedure] | None = None) -> None:
        self.url = url
        self._procedures = load_procedures(procedures)
        self._lock = threading.Lock()
        self._held = Held()
        self._owed = False  # a held piece recorded drops
        self._conn: pymysql.connections.Connection[Any] | None = None
        try:
            with self._cursor() as cur:
                for ddl in METADATA:
                    cur.execute(ddl)
            self._finish_drops()  # owed by a batch committed before a crash
        except pymysql.err.MySQLError as exc:
            self._conn = None
            raise WriterError(f"cannot open MariaDB target {self._where}: {exc}") from exc

    @property
    def _where(self) -> str:
        return self.url.split("@")[-1]  # never the password

    def _connection(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None:
            self._conn = connect(self.url)
        return self._conn

    def _cursor(self) -> pymysql.cursors.Cursor:
        cur: pymysql.cursors.Cursor = self._connection().cursor()
        return cur

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except pymysql.err.MySQLError:
                    pass
                self._conn = None

    def load_state(self, subscription: str) -> SubscriptionState:
        with self._lock:
            state: SubscriptionState = self._read(
                lambda ex: METADATA_SQL.load_state(ex, subscription), subscription
            )
            return state

    def _read(self, body: Any, subscription: str | None = None) -> Any:
        try:
            with self._cursor() as cur:
                out = body(Executor(cur))
            self._connection().rollback()  # end the read's transaction
            return out
        except pymysql.err.MySQLError as exc:
            self._fail(exc, subscription, None)
            raise

    # -- batches -----------------------------------------------------------------

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
        (subscriber/targets/held.py): one transaction spans the pieces."""
        with self._lock:
            try:
                if self._held.open:
                    self._held.check(subscription, first_seq)
                    if self._ddl_needed(steps):
                        raise WriterError(
                            "MariaDB commits DDL implicitly: a schema change inside a "
                            "transaction larger than the [batch] limits cannot be applied "
                            "atomically; raise [batch] max_entries and max_bytes",
                            subscription=subscription,
                            seq=first_seq,
                        )
                else:
                    self._run_additive_ddl(steps)
                    self._connection().begin()
                with self._cursor() as cur:
                    ex = Executor(cur)
                    if not self._held.open:
                        METADATA_SQL.open_batch(ex, subscription, incarnation, first_seq, reexecute)
                    written = sum(self._step(cur, ex, subscription, step) for step in steps)
                    owed = self._record_drops(cur, steps)
                    if not commit:
                        self._held.hold(subscription, last_seq)
                        return written
                    self._held.clear()
                    seqs = (first_seq, last_seq)
                    METADATA_SQL.close_batch(ex, subscription, incarnation, seqs, reexecute)
                self._connection().commit()
                if owed or self._owed:
                    self._finish_drops()
                return written
            except BaseException as exc:
                self._held.clear()
                self._fail(exc, subscription, first_seq)
                raise

    def abandon(self) -> None:
        """Roll back a group's held transaction, if one is open."""
        with self._lock:
            if self._held.open:
                self._held.clear()
                self._rollback()

    def _rollback(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.rollback()
        except pymysql.err.MySQLError:
            self._drop_connection()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
        self._conn = None

    def _fail(self, exc: BaseException, subscription: str | None, seq: int | None) -> None:
        sub = subscription or ""
        """Roll back; translate a driver error (the caller re-raises anything else)."""
        if is_transient(exc):
            self._drop_connection()  # a new one next time
            raise TransientError(
                f"MariaDB target {self._where}: {exc}", subscription=sub, seq=seq
            ) from exc
        self._rollback()
        if isinstance(exc, pymysql.err.MySQLError):
            raise WriterError(
                f"MariaDB target {self._where} refused the batch: {exc}",
                subscription=sub,
                seq=seq,
            ) from exc

    def _in_transaction(self, subscription: str, seq: int, body: Any) -> Any:
        with self._lock:
            try:
                self._connection().begin()
                with self._cursor() as cur:
                    result = body(Executor(cur))
                self._connection().commit()
                return result
            except BaseException as exc:
                self._fail(exc, subscription, seq)
                raise

    # -- the constraint-safe order (subscriber/apply/_order.py) -------------------

    def ordered_tables(self, tables: Iterable[str]) -> frozenset[str]:
        """The tables with a unique index besides the primary key."""
        names = {quote_table(t)[1:-1].replace('""', '"'): t for t in tables}
        if not names:
            return frozenset()
        with self._lock:
            rows = self._read(
                lambda ex: ex.execute(
                    "SELECT DISTINCT table_name FROM information_schema.statistics"
                    " WHERE table_schema = DATABASE() AND non_unique = 0"
                    " AND index_name <> 'PRIMARY' AND table_name IN ("
                    + ", ".join("%s" for _ in names)
                    + ")",
                    list(names),
                ).fetchall()
            )
        return frozenset(names[r[0]] for r in rows if r[0] in names)

    # -- DDL ---------------------------------------------------------------------

    def _columns(self, table: str) -> list[str]:
        with self._cursor() as cur:
            cur.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = DATABASE() AND table_name = %s ORDER BY ordinal_position",
                (quote_table(table)[1:-1].replace('""', '"'),),
            )
            return [str(r[0]) for r in cur.fetchall()]

    def _additive_ddl(self, steps: Sequence[Step]) -> list[str]:
        out: list[str] = []
        have: dict[str, set[str]] = {}
        for step in steps:
            if not isinstance(step, SchemaStep):
                continue
            schema = step.target or step.schema
            check_schema(step.schema)
            check_schema(schema)
            if schema.table not in have:
                have[schema.table] = {c.lower() for c in self._columns(schema.table)}
            cols = have[schema.table]
            if not cols:
                out.append(create_table_sql(schema))
                cols.update(c.name.lower() for c in schema.columns)
                continue
            for c in schema.columns:
                if c.name.lower() not in cols:
                    out.append(
                        f"ALTER TABLE {quote_table(schema.table)} ADD COLUMN"
                        f" {quote(c.name)} {column_sql(c, key=False)}"
                    )
                    cols.add(c.name.lower())
        return out

    def _ddl_needed(self, steps: Sequence[Step]) -> bool:
        return bool(self._additive_ddl(steps)) or bool(self._dropped(steps))

    def _run_additive_ddl(self, steps: Sequence[Step]) -> None:
        ddl = self._additive_ddl(steps)
        self._connection().rollback()  # nothing is open: the DDL commits only itself
        with self._cursor() as cur:
            for statement in ddl:
                cur.execute(statement)

    def _dropped(self, steps: Sequence[Step]) -> dict[str, set[str]]:
        """Per table, the columns its schema steps dropped and its last one lacks
        (a shaped table, transforms or history, keeps its columns)."""
        dropped: dict[str, set[str]] = {}
        final: dict[str, set[str]] = {}
        for step in steps:
            if not isinstance(step, SchemaStep) or step.target is not None:
                continue
            now = {c.name.lower() for c in step.schema.columns}
            final[step.schema.table] = now
            if step.previous is not None:
                gone = {c.name for c in step.previous.columns if c.name.lower() not in now}
                dropped.setdefault(step.schema.table, set()).update(gone)
        return {
            t: {c for c in cols if c.lower() not in final[t]}
            for t, cols in dropped.items()
            if any(c.lower() not in final[t] for c in cols)
        }

    def _record_drops(self, cur: pymysql.cursors.Cursor, steps: Sequence[Step]) -> bool:
        """In the batch's transaction: the DROP COLUMNs it owes (``txrepl_pending_drops``)."""
        owed = self._dropped(steps)
        for table, cols in owed.items():
            for name in cols:
                cur.execute(
                    "INSERT IGNORE INTO txrepl_pending_drops (table_name, column_name)"
                    " VALUES (%s, %s)",
                    (table, name),
                )
        self._owed = self._owed or bool(owed)
        return bool(owed)

    def _finish_drops(self) -> None:
        """After a commit (or at open, after a crash): the owed DROP COLUMNs, each once
        (a column already gone is skipped), each row deleted once done."""
        self._owed = False
        with self._cursor() as cur:
            cur.execute("SELECT table_name, column_name FROM txrepl_pending_drops")
            owed = [(str(t), str(c)) for t, c in cur.fetchall()]
        self._connection().rollback()
        for table, name in owed:
            have = {c.lower() for c in self._columns(table)}
            with self._cursor() as cur:
                if name.lower() in have:
                    cur.execute(f"ALTER TABLE {quote_table(table)} DROP COLUMN {quote(name)}")
                cur.execute(
                    "DELETE FROM txrepl_pending_drops WHERE table_name = %s AND column_name = %s",
                    (table, name),
                )
            self._connection().commit()

    # -- steps -------------------------------------------------------------------

    def _step(
        self, cur: pymysql.cursors.Cursor, ex: Executor, subscription: str, step: Step
    ) -> int:
        if isinstance(step, RowsStep):
            return self._rows(cur, step)
        if isinstance(step, HistoryStep):
            return self._history(cur, step)
        if isinstance(step, SchemaStep):
            METADATA_SQL.record_schema(ex, subscription, step.schema)
            return 0
        if isinstance(step, TruncateStep):
            cur.execute(f"DELETE FROM {quote_table(step.table)}")
            return 0
        if isinstance(step, SqlStep):
            cur.execute(step.sql)
            return 0
        if isinstance(step, CallStep):
            args = [values.decode(v) for v in step.args]
            if step.name in self._procedures:
                self._procedures[step.name](cur, *args)
                return 0
            if not re.fullmatch(r"[A-Za-z_][\w.]*", step.name):
                raise ApplyError(f"procedure call {step.name!r}: not a procedure name")
            cur.execute(f"CALL {step.name}({', '.join('%s' for _ in args)})", args)
            return 0
        raise AssertionError(f"unknown step {step!r}")

    def _rows(self, cur: pymysql.cursors.Cursor, step: RowsStep) -> int:
        schema = step.schema
        names = [c.name for c in schema.columns]
        written = 0
        if step.deletes.num_rows:
            key_idx = [names.index(k) for k in schema.primary_key]
            keys = list(
                zip(*(column_values(step.deletes, i, schema) for i in key_idx), strict=True)
            )
            cols = ", ".join(quote(names[i]) for i in key_idx)
            one = "(" + ", ".join("%s" for _ in key_idx) + ")"
            for at in range(0, len(keys), _DELETE_CHUNK):
                chunk = keys[at : at + _DELETE_CHUNK]
                cur.execute(
                    f"DELETE FROM {quote_table(schema.table)} WHERE ({cols}) IN"
                    f" ({', '.join(one for _ in chunk)})",
                    [v for key in chunk for v in key],
                )
            written += step.deletes.num_rows
        if step.upserts.num_rows:
            cols_ = [column_values(step.upserts, i, schema) for i in range(len(names))]
            cur.executemany(upsert_sql(schema), list(zip(*cols_, strict=True)))
            written += step.upserts.num_rows
        return written

    def _history(self, cur: pymysql.cursors.Cursor, step: HistoryStep) -> int:
        schema, versions = step.schema, step.versions
        names = [c.name for c in schema.columns]
        table = quote_table(schema.table)
        keys = list(schema.primary_key[:-1])
        where = " AND ".join(f"{quote(k)} <=> %s" for k in keys)
        firsts = versions.filter(versions.column("_first"))
        order = [names.index("_first_seq")] + [names.index(k) for k in keys]
        close = list(zip(*(column_values(firsts, i, schema) for i in order), strict=True))
        cur.executemany(
            f'UPDATE {table} SET "_last_seq" = %s - 1 WHERE {where} AND "_last_seq" IS NULL',
            close,
        )
        rows = list(
            zip(*(column_values(versions, i, schema) for i in range(len(names))), strict=True)
        )
        cur.executemany(
            f"INSERT INTO {table} ({', '.join(quote(n) for n in names)})"
            f" VALUES ({', '.join('%s' for _ in names)})",
            rows,
        )
        return int(versions.num_rows)
