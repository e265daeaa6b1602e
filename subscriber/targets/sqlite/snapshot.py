"""Load a publisher snapshot into a SQLite target: shadow tables, one swap.

Driven by :func:`subscriber.reinit.client.load_into` (the Snapshot stream client)
through the loader protocol (:class:`subscriber.reinit.client.ShadowLoader`).

Atomicity argument:

1. The snapshot (publisher/snapshot.py) is the content of every published table
   as of exactly one seq S.
2. It is loaded into shadow tables ``txrepl_shadow__<table>`` on the target, in
   chunks, through Spark.  Readers see the old tables meanwhile; a kill at any
   point leaves them intact (the shadows are dropped and rebuilt by the next run).
3. One target transaction then drops each old table and puts its shadow in
   place: an old table with the same columns is re-created from its own
   ``CREATE TABLE`` (UNIQUE, CHECK, REFERENCES written inside it survive; a row
   they refuse fails the swap) and the shadow's rows copied in; a new table or
   one whose columns changed gets the shadow renamed.  It then re-creates the
   indexes and triggers an operator made on the old table
   (their SQL from ``sqlite_master``; one that fails, say on a column the
   publisher does not send, fails the swap, which rolls back), replaces the
   subscription's recorded schemas and sets its level to S with the snapshot's
   incarnation.  A table loaded as published gets the source's constraints
   (``TableSchema.constraints``): a new one with foreign keys is created with
   them and the shadow's rows copied in (SQLite adds no key to a table), and the
   source's UNIQUE constraints and indexes are created after the carried ones
   (those the old table had from the source are not carried: the new schema's
   replace them).  Readers see the old state or the new one,
   never a half-loaded table; the level and the rows move together.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from common.names import parse_table
from common.rpc import txrepl_pb2 as pb
from common.values import decode
from subscriber.apply.errors import WriterError
from subscriber.apply.session import arrow_frame
from subscriber.reinit.errors import SnapshotError
from subscriber.targets.sqlite._ddl import (
    follow_clauses,
    follow_indexes,
    index_names,
    table_clauses,
)
from subscriber.targets.sqlite.writer import (
    METADATA_SQL,
    SqliteWriter,
    declared,
    placed_params,
    quote,
    sqlite_value,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SHADOW_PREFIX", "SqliteSnapshotLoader"]

SHADOW_PREFIX = "txrepl_shadow__"
FLUSH_ROWS = 50_000


def _ddl(name: str, schema: pb.TableSchema, more: Sequence[str] = ()) -> str:
    cols = []
    for c in schema.columns:
        decl = declared(c, schema)  # the same affinities the apply writer uses
        null = "" if c.nullable or c.name in schema.primary_key else " NOT NULL"
        cols.append(f"{quote(c.name)} {decl}{null}".rstrip())
    pk = ", ".join(quote(k) for k in schema.primary_key)
    return f"CREATE TABLE {quote(name)} ({', '.join([*cols, f'PRIMARY KEY ({pk})', *more])})"


def _through_spark(
    spark: SparkSession, rows: list[tuple[object, ...]], n: int
) -> list[tuple[object, ...]]:
    """Hand a chunk to Spark as Arrow and take it back (the hook for transforms)."""
    names = [f"c{i}" for i in range(n)]
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in range(n)]
    table = pa.table({name: pa.array(list(col)) for name, col in zip(names, columns, strict=True)})
    back = arrow_frame(spark, table).toArrow()
    return list(zip(*(back.column(i).to_pylist() for i in range(n)), strict=True))


def _pass(spark: SparkSession, rows: list[tuple[object, ...]], n: int) -> list[tuple[object, ...]]:
    try:
        return _through_spark(spark, rows, n)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # A column whose values have mixed types (SQLite's dynamic typing): Arrow wants
        # one type per column, so this chunk is written as it came.
        return rows


class SqliteSnapshotLoader:
    """Shadow tables in the SQLite file, each chunk passed through Spark."""

    def __init__(self, path: Path, spark: SparkSession | None, subscription: str) -> None:
        if spark is None:
            raise SnapshotError("loading a snapshot into SQLite needs a Spark session")
        SqliteWriter(path).close()  # creates the metadata tables if missing
        self.flush_rows = FLUSH_ROWS
        self.log_fields: Mapping[str, str] = {}
        self.single_start = False
        self.prefetch = False
        self.copy_text = False  # rows only: SQLite has no COPY
        self.spark = spark
        self.subscription = subscription
        self.schemas: dict[str, pb.TableSchema] = {}
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=60)
        self.conn.execute("PRAGMA foreign_keys=OFF")  # the swap drops referenced tables

    def begin(self, start: pb.SnapshotStart) -> None:
        for t in start.tables:
            self.schemas[t.schema.table] = t.schema
            shadow = SHADOW_PREFIX + parse_table(t.schema.table).flat
            self.conn.execute(f"DROP TABLE IF EXISTS {quote(shadow)}")
            self.conn.execute(_ddl(shadow, t.schema))

    def buffer(self, table: str, buf: list[Any], rows: Any) -> None:
        buf.extend(tuple(sqlite_value(decode(v)) for v in r.values) for r in rows)

    def write(self, table: str, rows: list[Any]) -> int:
        n = len(self.schemas[table].columns)
        columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(n)]
        marks, params = placed_params(columns)
        # (through Spark unless it holds TEXT that is not UTF-8, which it would make bytes)
        rows = _pass(self.spark, rows, n) if len(params) == n else list(zip(*params, strict=True))
        self.conn.execute("BEGIN")
        shadow = quote(SHADOW_PREFIX + parse_table(table).flat)
        self.conn.executemany(f"INSERT INTO {shadow} VALUES ({', '.join(marks)})", rows)
        self.conn.execute("COMMIT")
        return len(rows)

    def write_copy(self, table: str, text: bytes) -> None:
        raise SnapshotError(f"COPY text for table {table!r}: a SQLite target takes rows")

    def swap(self, start: pb.SnapshotStart, recorded: Mapping[str, pb.TableSchema]) -> None:
        try:
            flat = [parse_table(t).flat for t in self.schemas]
            _swap(self.conn, self.subscription, start, self.schemas, recorded)
        except SnapshotError:
            # Refused as loaded (a rerun would load them again): leave no copy behind.
            for table in flat:
                self.conn.execute(f"DROP TABLE IF EXISTS {quote(SHADOW_PREFIX + table)}")
            raise

    def close(self) -> None:
        self.conn.close()


def _swap(
    conn: sqlite3.Connection,
    subscription: str,
    start: pb.SnapshotStart,
    schemas: Mapping[str, pb.TableSchema],
    recorded: Mapping[str, pb.TableSchema],
) -> None:
    """Step 3 of the module docstring: one transaction swaps the tables of ``schemas``
    (the loaded ones: their shadows in), records the ``recorded`` schemas (the
    published ones) and sets the level."""
    tables = {parse_table(t).flat: s for t, s in schemas.items()}
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = METADATA_SQL.load_state(conn, subscription).schemas
        # Indexes and triggers an operator made on the old tables (their SQL names
        # the table, which the shadow is renamed to); automatic indexes have no SQL,
        # and the source's own (named by the recorded schema) give way to the new
        # schema's.
        source = set().union(*(index_names(before.get(s.table)) for s in schemas.values()))
        carried = [
            row
            for row in conn.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE type IN"
                " ('index', 'trigger') AND sql IS NOT NULL AND tbl_name IN"
                f" ({', '.join('?' * len(tables))}) ORDER BY type, name",
                list(tables),
            ).fetchall()
            if row[0] != "index" or row[1] not in source
        ]
        plain = {t: s for t, s in tables.items() if recorded.get(s.table) == s}
        kept = {table: _replace(conn, table, plain.get(table)) for table in tables}
        for kind, name, table, statement in carried:
            try:
                conn.execute(statement)
            except sqlite3.Error as exc:
                raise SnapshotError(
                    f"cannot carry {kind} {name!r} of {table!r} over to the new table: {exc};"
                    " drop it or make it fit the published columns, then run the reinit again"
                ) from exc
        for table, schema in plain.items():
            try:
                old = before.get(schema.table)
                if old is not None and kept.get(table):
                    follow_clauses(conn, schema, old, table)
                follow_indexes(conn, schema, None, quote(table))
            except WriterError as exc:
                raise SnapshotError(
                    f"the snapshot's rows violate a constraint: {exc.__cause__}"
                ) from exc
        METADATA_SQL.replace_schemas(conn, subscription, recorded)
        METADATA_SQL.set_level(conn, subscription, start.incarnation, start.seq)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({quote(table)})")]


def _replace(conn: sqlite3.Connection, table: str, schema: pb.TableSchema | None) -> bool:
    """Put the shadow of ``table`` in its place.  An old table with the same columns
    keeps its own definition (UNIQUE, CHECK, REFERENCES, collations written in its
    CREATE TABLE): it is re-created from that SQL and the rows copied in.  Otherwise
    (a new table, or its columns changed) the shadow is renamed into place, or, when
    ``schema`` (the table loaded as published) has foreign keys, the table is created
    with them (SQLite adds none to an existing table) and the rows copied in."""
    shadow = quote(SHADOW_PREFIX + table)
    found = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    cols = _columns(conn, SHADOW_PREFIX + table)
    keep = found is not None and found[0] is not None and _columns(conn, table) == cols
    conn.execute(f"DROP TABLE IF EXISTS {quote(table)}")
    fks = table_clauses(schema) if schema is not None and not keep else []
    if not keep and not fks:
        conn.execute(f"ALTER TABLE {shadow} RENAME TO {quote(table)}")
        return False
    names = ", ".join(quote(c) for c in cols)
    try:
        conn.execute(found[0] if keep or schema is None else _ddl(table, schema, fks))
        conn.execute(f"INSERT INTO {quote(table)} ({names}) SELECT {names} FROM {shadow}")
    except sqlite3.Error as exc:
        raise SnapshotError(
            f"cannot keep the definition of {table!r} (its constraints) for the new rows:"
            f" {exc}; change the table's definition, then run the reinit again"
        ) from exc
    conn.execute(f"DROP TABLE {shadow}")
    return keep
