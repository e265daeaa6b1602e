"""Load a publisher snapshot into a PostgreSQL target: shadow tables, one swap.

Driven by :func:`subscriber.reinit.client.load_into` (the Snapshot stream client)
through :class:`PostgresSnapshotLoader`, the loader protocol
(:class:`subscriber.reinit.client.ShadowLoader`) over :class:`PgShadowLoader`.
Rows go from the driver straight into PostgreSQL with ``COPY ... FROM STDIN``
(psycopg 3); Spark is involved only for a table with transforms, whose rows
:mod:`subscriber.reinit.shape` shapes before they get here.

Atomicity argument
==================

Everything the load does on the target happens in **one target transaction** T
(after a short, separate one that creates the empty schema ``txrepl_shadow`` once):

1. T takes a transaction-level advisory lock for the subscription (a second
   reinit of the same subscription waits for it, at most 30 s, then fails), then
   creates ``txrepl_shadow.<table>`` for every published table (the same column
   types the apply writer uses, :func:`subscriber.targets.postgres._copy.pg_type`).
2. The snapshot's rows (the content of every published table as of exactly one
   seq S, publisher/snapshot.py) are copied into the shadows, chunk by chunk,
   still inside T; then each shadow gets its primary key (building the index
   once, after the load, is faster than maintaining it row by row, and a
   duplicate key fails here, before anything is swapped).
3. Still inside T: lock every old table ``ACCESS EXCLUSIVE`` (under a short
   ``lock_timeout``, inside a savepoint, retried until ``swap_timeout_s``, so a
   long-running reader delays the swap instead of queueing every other reader
   behind it), drop it, move the shadow into its schema
   (``ALTER TABLE ... SET SCHEMA``: the primary key index moves with it and keeps
   the name ``<table>_pkey`` the apply writer's own ``CREATE TABLE`` gives),
   replace the subscription's rows in ``txrepl_schemas``, and set its level row to
   S with the snapshot's incarnation (the row locked ``FOR UPDATE`` first, as the
   apply writer does, so a concurrent batch waits and then fails its level check).
4. COMMIT.

Until step 4 commits, nothing of T is visible to any other session: readers keep
reading the old tables (MVCC), and from step 3 on they wait for T's locks (never
longer than one ``lock_timeout`` attempt while T is still waiting itself).  The
commit makes the new tables, the schemas and the level visible together; a
reader that was waiting on an old table re-resolves its name after the lock is
granted (PostgreSQL's ``RangeVarGetRelidExtended`` retries when the relation
changed while it waited), so it reads the new table.  A SIGKILL of the reinit
before it has sent COMMIT closes its connection: the server rolls T back (at
the latest when the backend next waits for the client, i.e. after at most one
``lock_timeout`` attempt), the advisory lock goes with it, no shadow table
survives (they were created in T), and the target holds exactly the old state at
the old level, so the command can simply be run again.  Once COMMIT is sent the
server commits T whether the client lives or not: the new state at level S,
complete.  Either way, rerunning is safe (it loads a fresh snapshot at S' >= S).

Carried over (step 3, ``_carry.py``): what an operator added to an old table
(constraints, indexes, triggers, grants, storage parameters, comments), and the
foreign keys of other tables that reference it; the rules are in that module.

The source's constraints (``TableSchema.constraints``: UNIQUE, CHECK, indexes,
foreign keys within the publication, as the apply writer follows them,
``_ddl.py``) are created on every table loaded as published, after the carried
items and still in T: every table's own first, then the foreign keys, validated
against the loaded rows (``NOT VALID`` where the source holds orphans too).  Those
the old table had from the source (its recorded schema names them) are not
carried: the new schema's replace them.

Limits: the old table is dropped, so views that depend on it make the swap fail
(with PostgreSQL's message; the target is unchanged); columns the publisher
does not send, the owner (the new table is the reinit role's), column grants,
row security policies and publications/rules on it are not carried over.  The
whole load is one transaction, which holds back VACUUM's horizon on the target
while it runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from common.names import parse_table
from common.rpc import txrepl_pb2 as pb
from common.values import decode
from subscriber.apply.errors import WriterError
from subscriber.reinit.errors import SnapshotError
from subscriber.targets.postgres._carry import carried_items, table_exists, unhook
from subscriber.targets.postgres._ddl import create_constraints, source_names
from subscriber.targets.postgres._identity import column_defs
from subscriber.targets.postgres._names import create_schema, table_sql
from subscriber.targets.postgres._sequences import advance_sequences, carry_positions
from subscriber.targets.postgres.writer import METADATA_SQL, PostgresWriter

__all__ = ["SHADOW_SCHEMA", "PgShadowLoader", "PostgresSnapshotLoader"]

SHADOW_SCHEMA = "txrepl_shadow"

Q = sql.Identifier


class PgShadowLoader:
    """Steps 1-4 of the module docstring on one connection (not thread-safe)."""

    def __init__(
        self,
        dsn: str,
        *,
        role: str | None = None,
        lock_timeout_s: float = 2.0,
        swap_timeout_s: float = 120.0,
        connect_timeout_s: int = 10,
    ) -> None:
        self.where = dsn.rsplit("@", 1)[-1]  # never the password
        self.role = role
        self.lock_timeout_s = lock_timeout_s
        self.swap_timeout_s = swap_timeout_s
        self.wait_s = 30  # for another reinit of the same subscription
        self.schemas: dict[str, pb.TableSchema] = {}
        try:
            PostgresWriter(dsn, role=role).close()  # creates the metadata tables if missing
            self.conn: psycopg.Connection[Any] = psycopg.connect(
                dsn,
                autocommit=True,
                connect_timeout=connect_timeout_s,
                client_encoding="UTF8",
                application_name="txrepl-reinit",
            )
        except Exception as exc:
            raise self._error("cannot connect", exc) from exc

    def _error(self, what: str, exc: BaseException) -> Exception:
        text = str(exc)
        cause = getattr(exc, "__cause__", None)
        if isinstance(cause, psycopg.Error):
            text = str(cause)
        return SnapshotError(f"PostgreSQL target {self.where}: {what}: {text}".rstrip(": "))

    def close(self) -> None:
        # Closing an unfinished T rolls it back (step 4 never happened).
        self.conn.close()

    # -- steps -----------------------------------------------------------------

    def prepare(self, subscription: str, tables: Sequence[pb.TableSchema]) -> None:
        """Step 1: the shadow schema (own transaction), then T with its shadow tables."""
        cur = self.conn.cursor()
        try:
            with self.conn.transaction():
                cur.execute("SELECT pg_advisory_xact_lock(hashtext('txrepl metadata'))")
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(Q(SHADOW_SCHEMA)))
            cur.execute("BEGIN")
            # A killed earlier run's session may linger a moment: wait for it, boundedly.
            cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{self.wait_s}s",))
            try:
                cur.execute(
                    "SELECT pg_advisory_xact_lock(hashtext('txrepl reinit'), hashtext(%s))",
                    (subscription,),
                )
            except psycopg.errors.LockNotAvailable:
                raise SnapshotError(
                    f"another reinit of {subscription!r} is still loading into {self.where}"
                    f" (waited {self.wait_s} s)"
                ) from None
            cur.execute("SELECT set_config('lock_timeout', '0', true)")
            if self.role:
                cur.execute(sql.SQL("SET LOCAL ROLE {}").format(Q(self.role)))
            for schema in tables:
                if not schema.primary_key:
                    raise SnapshotError(f"table {schema.table!r} has no primary key")
                self.schemas[schema.table] = schema
                shadow = sql.SQL("{}.{}").format(Q(SHADOW_SCHEMA), Q(schema.table))
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(shadow))
                cols = sql.SQL(", ").join(column_defs(schema))  # _identity.py
                cur.execute(sql.SQL("CREATE TABLE {} ({})").format(shadow, cols))
        except psycopg.Error as exc:
            raise self._error("cannot create the shadow tables", exc) from exc

    def write(self, table: str, rows: Iterable[Sequence[object]]) -> None:
        """Step 2: COPY decoded rows (``common.values`` Python values) into a shadow."""
        schema = self.schemas[table]
        copy = sql.SQL("COPY {}.{} ({}) FROM STDIN").format(
            Q(SHADOW_SCHEMA), Q(table), sql.SQL(", ").join(Q(c.name) for c in schema.columns)
        )
        try:
            with self.conn.cursor() as cur, cur.copy(copy) as cp:
                for row in rows:
                    cp.write_row(row)
        except (psycopg.Error, TypeError, ValueError) as exc:
            raise self._error(f"refused the snapshot rows of table {table!r}", exc) from exc

    def write_copy(self, table: str, text: bytes) -> None:
        """Step 2: COPY text lines (the source's ``COPY ... TO STDOUT``) into a shadow.

        ``FREEZE``: the shadow was created in T, so its rows can be written frozen
        (nothing else can see them before T commits); readers after the swap then
        find them all-visible instead of setting hint bits on every page."""
        schema = self.schemas[table]
        copy = sql.SQL("COPY {}.{} ({}) FROM STDIN (FREEZE)").format(
            Q(SHADOW_SCHEMA), Q(table), sql.SQL(", ").join(Q(c.name) for c in schema.columns)
        )
        try:
            with self.conn.cursor() as cur, cur.copy(copy) as cp:
                cp.write(text)
        except psycopg.Error as exc:
            raise self._error(f"refused the snapshot rows of table {table!r}", exc) from exc

    def swap(
        self,
        subscription: str,
        incarnation: str,
        seq: int,
        recorded: Mapping[str, pb.TableSchema] | None = None,
        positions: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        """Steps 2 (primary keys), 3 and 4; ``recorded``: the schemas to record for the
        subscription (the published ones, when a table loads shaped; default: the
        shadows')."""
        cur = self.conn.cursor()
        try:
            for table, schema in self.schemas.items():
                cur.execute(
                    sql.SQL("ALTER TABLE {}.{} ADD PRIMARY KEY ({})").format(
                        Q(SHADOW_SCHEMA),
                        Q(table),
                        sql.SQL(", ").join(Q(k) for k in schema.primary_key),
                    )
                )
            cur.execute("SELECT current_schema()")
            row = cur.fetchone()
            default = row[0] if row else None
            homes: dict[str, str] = {}
            for table in self.schemas:
                cur.execute(
                    "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE c.oid = to_regclass(%s)",
                    (table_sql(table).as_string(cur),),
                )
                found = cur.fetchone()
                home = found[0] if found else parse_table(table).schema or default
                if home is None:
                    raise SnapshotError(
                        f"PostgreSQL target {self.where}: no schema to create {table!r} in"
                        " (the search_path names no existing schema)"
                    )
                if home == SHADOW_SCHEMA:
                    raise SnapshotError(
                        f"PostgreSQL target {self.where}: the search_path resolves {table!r}"
                        f" to the shadow schema {SHADOW_SCHEMA!r}"
                    )
                homes[table] = home
            self._lock_old(cur, homes)
            before = METADATA_SQL.load_state(cur, subscription).schemas
            carried = [
                item
                for table, home in homes.items()
                if table_exists(cur, home, table)
                for item in carried_items(
                    cur,
                    home,
                    table,
                    {c.name for c in self.schemas[table].columns},
                    source_names(before.get(table)),
                )
            ]
            carried.sort(key=lambda item: item[0].startswith("foreign key"))  # parents first
            carried += unhook(cur, homes)
            for table, home in homes.items():
                # The shadow is named by the wire text (unique); in its home it takes
                # the table's own name (common/names.py).
                rel = parse_table(table).name
                create_schema(cur, table)
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}.{}").format(Q(home), Q(rel)))
                cur.execute(
                    sql.SQL("ALTER TABLE {}.{} SET SCHEMA {}").format(
                        Q(SHADOW_SCHEMA), Q(table), Q(home)
                    )
                )
                if rel != table:
                    cur.execute(
                        sql.SQL("ALTER TABLE {}.{} RENAME TO {}").format(Q(home), Q(table), Q(rel))
                    )
            for what, statement in carried:
                try:
                    cur.execute(statement)
                except psycopg.Error as exc:
                    raise self._error(
                        f"cannot carry {what} over to the new table (drop it or make it fit"
                        " the published columns, then run the reinit again)",
                        exc,
                    ) from exc
            try:  # the source's constraints, on the tables loaded as published
                create_constraints(
                    cur,
                    [
                        s
                        for t, s in self.schemas.items()
                        if recorded is None or recorded.get(t) == s
                    ],
                )
            except WriterError as exc:
                raise self._error("the snapshot's rows violate a constraint", exc) from exc
            # sequences past the loaded ids, and up to the source's positions
            owned: dict[str, list[tuple[str, str]]] = {}
            advance_sequences(cur, list(homes), owned)
            carry_positions(cur, dict(positions or {}), owned)
            METADATA_SQL.lock_level(cur, subscription)
            METADATA_SQL.replace_schemas(
                cur, subscription, self.schemas if recorded is None else recorded
            )
            METADATA_SQL.set_level(cur, subscription, incarnation, seq)
            cur.execute("COMMIT")
        except psycopg.errors.DependentObjectsStillExist as exc:
            raise self._error(
                "the old tables cannot be replaced (a view depends on them)",
                exc,
            ) from exc
        except psycopg.Error as exc:
            raise self._error("the swap failed", exc) from exc

    def _lock_old(self, cur: psycopg.Cursor[Any], homes: dict[str, str]) -> None:
        """ACCESS EXCLUSIVE on the old tables, in short attempts (see step 3)."""
        names = [
            sql.SQL("{}.{}").format(Q(home), Q(parse_table(table).name))
            for table, home in sorted(homes.items())
            if table_exists(cur, home, table)
        ]
        if not names:
            return
        lock = sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.SQL(", ").join(names))
        deadline = time.monotonic() + self.swap_timeout_s
        while True:
            cur.execute("SAVEPOINT txrepl_swap")
            cur.execute(
                "SELECT set_config('lock_timeout', %s, true)",
                (f"{int(self.lock_timeout_s * 1000)}ms",),
            )
            try:
                cur.execute(lock)
            except psycopg.errors.LockNotAvailable as exc:
                cur.execute("ROLLBACK TO SAVEPOINT txrepl_swap")
                if time.monotonic() >= deadline:
                    raise SnapshotError(
                        f"PostgreSQL target {self.where}: could not lock the old tables within"
                        f" {self.swap_timeout_s:g} s (long-running readers?); run the reinit"
                        " again"
                    ) from exc
                continue
            cur.execute("SELECT set_config('lock_timeout', '0', true)")
            cur.execute("RELEASE SAVEPOINT txrepl_swap")
            return


PG_FLUSH_ROWS = 20_000  # one COPY each: progress is reported per flush

# Value kinds whose field is already what COPY's text form needs (a decimal as its
# canonical text: PostgreSQL parses it by the column's type, exactly).
_AS_IS = frozenset({"int", "float", "text", "blob", "boolean", "json", "decimal"})


def _pg_row(values: Any) -> list[object]:
    """A snapshot row as values for ``Copy.write_row`` (the load's hot loop)."""
    out: list[object] = []
    for v in values:
        kind = v.WhichOneof("kind")
        if kind in _AS_IS:
            out.append(getattr(v, kind))
        elif kind is None or kind == "null":
            out.append(None)
        else:
            out.append(decode(v))
    return out


class PostgresSnapshotLoader:
    """The loader protocol for PostgreSQL: one transaction from the shadow tables to
    the swap (:class:`PgShadowLoader`)."""

    def __init__(self, dsn: str, subscription: str, *, role: str | None = None) -> None:
        self.flush_rows = PG_FLUSH_ROWS
        self.log_fields: Mapping[str, str] = {"target": "postgresql"}
        self.single_start = True
        self.prefetch = True
        self.copy_text = True
        self.loader = PgShadowLoader(dsn, role=role)
        self.subscription = subscription
        self.sequence_positions: dict[tuple[str, str], int] = {}  # the client sets

    def begin(self, start: pb.SnapshotStart) -> None:
        self.loader.prepare(self.subscription, [t.schema for t in start.tables])

    def buffer(self, table: str, buf: list[Any], rows: Any) -> None:
        width = len(self.loader.schemas[table].columns)
        for r in rows:
            if len(r.values) != width:
                raise SnapshotError(
                    f"snapshot row of {table!r} has {len(r.values)} values,"
                    f" the table {width} columns"
                )
            buf.append(_pg_row(r.values))

    def write(self, table: str, rows: list[Any]) -> int:
        self.loader.write(table, rows)
        return len(rows)

    def write_copy(self, table: str, text: bytes) -> None:
        self.loader.write_copy(table, text)

    def swap(self, start: pb.SnapshotStart, recorded: Mapping[str, pb.TableSchema]) -> None:
        self.loader.swap(
            self.subscription, start.incarnation, start.seq, recorded, self.sequence_positions
        )

    def close(self) -> None:
        self.loader.close()
