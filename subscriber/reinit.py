"""Re-initialise a subscription from a publisher snapshot.

The target is a SQLite file (this module) or a PostgreSQL database
(:mod:`subscriber.reinit_pg`, which has its own atomicity argument).

Atomicity argument (SQLite):

1. The snapshot (publisher/snapshot.py) is the content of every published table
   as of exactly one seq S.
2. It is loaded into shadow tables ``txrepl_shadow__<table>`` on the target, in
   chunks, through Spark.  Readers see the old tables meanwhile; a kill at any
   point leaves them intact (the shadows are dropped and rebuilt by the next run).
3. One target transaction then drops each old table, renames its shadow into
   place, re-creates the indexes and triggers an operator made on the old table
   (their SQL from ``sqlite_master``; one that fails, say on a column the
   publisher does not send, fails the swap, which rolls back), replaces the
   subscription's recorded schemas and sets its level to S with the snapshot's
   incarnation.  Readers see the old state or the new one,
   never a half-loaded table; the level and the rows move together.

The subscriber then resumes from S + 1.  A table with transforms
(``[apply.tables.<table>]``) is loaded into its target table, shaped as the apply
shapes its changes (:mod:`subscriber.reinit_shape`); the recorded schemas stay
the published ones, from which the apply derives the target's.  A table in
history mode is refused before anything is written (:class:`SnapshotRefused`):
the snapshot would replace the versions it keeps with the current rows.
"""

from __future__ import annotations

import datetime as dt
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import structlog

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.values import decode
from subscriber.apply.options import TableOptions
from subscriber.apply.session import arrow_frame
from subscriber.apply.sqlite import SqliteWriter, quote, sqlite_value

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from subscriber.reinit_pg import PgShadowLoader

__all__ = ["SnapshotError", "SnapshotProgress", "SnapshotRefused", "load_snapshot"]

log = structlog.get_logger(__name__)

SHADOW_PREFIX = "txrepl_shadow__"
FLUSH_ROWS = 50_000
PG_FLUSH_ROWS = 20_000  # one COPY each: progress is reported per flush

# Declared SQLite types per logical type: the same affinities the apply writer uses.
_DECLARED = {
    pb.COLUMN_TYPE_INTEGER: "INTEGER",
    pb.COLUMN_TYPE_FLOAT: "REAL",
    pb.COLUMN_TYPE_BYTES: "BLOB",
    pb.COLUMN_TYPE_BOOLEAN: "INTEGER",
}


class SnapshotError(Exception):
    """The snapshot could not be loaded; the target is unchanged."""


class SnapshotRefused(SnapshotError):
    """The configuration rules the snapshot out (a retry cannot help)."""


@dataclass
class SnapshotProgress:
    seq: int = 0
    rows_expected: int = 0
    rows_loaded: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.rows_loaded / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        if not rate:
            return None
        return max(0.0, (self.rows_expected - self.rows_loaded) / rate)


def _ddl(name: str, schema: pb.TableSchema) -> str:
    cols = []
    for c in schema.columns:
        decl = _DECLARED.get(c.type, "TEXT" if c.type else "")
        null = "" if c.nullable or c.name in schema.primary_key else " NOT NULL"
        cols.append(f"{quote(c.name)} {decl}{null}".rstrip())
    pk = ", ".join(quote(k) for k in schema.primary_key)
    return f"CREATE TABLE {quote(name)} ({', '.join(cols)}, PRIMARY KEY ({pk}))"


def _through_spark(
    spark: SparkSession, rows: list[tuple[object, ...]], n: int
) -> list[tuple[object, ...]]:
    """Hand a chunk to Spark as Arrow and take it back (the hook for transforms)."""
    import pyarrow as pa

    names = [f"c{i}" for i in range(n)]
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in range(n)]
    table = pa.table({name: pa.array(list(col)) for name, col in zip(names, columns, strict=True)})
    back = arrow_frame(spark, table).toArrow()
    return list(zip(*(back.column(i).to_pylist() for i in range(n)), strict=True))


def _pass(spark: SparkSession, rows: list[tuple[object, ...]], n: int) -> list[tuple[object, ...]]:
    import pyarrow as pa

    try:
        return _through_spark(spark, rows, n)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # A column whose values have mixed types (SQLite's dynamic typing): Arrow wants
        # one type per column, so this chunk is written as it came.
        return rows


def load_snapshot(
    *,
    address: str,
    publisher: str,
    publication: str,
    subscriber: str,
    subscription: str,
    target: Path | str,
    spark: SparkSession | None = None,
    channel: grpc.Channel | None = None,
    metadata: tuple[tuple[str, str], ...] | None = None,
    on_progress: Callable[[SnapshotProgress], None] | None = None,
    chunk_rows: int = 5000,
    role: str | None = None,
    tables: Mapping[str, TableOptions] | None = None,
) -> tuple[str, int]:
    """Load the publication's snapshot into ``target``; returns (incarnation, seq).

    ``target`` is a SQLite file (a ``Path``; ``spark`` required) or a PostgreSQL URL
    (``postgresql://...``; ``spark`` unused, ``role`` the replay role to create the
    tables as).  ``tables``: the subscriber's per-table options (``ApplyOptions.tables``);
    a table with transforms is loaded shaped (Spark required), one in history mode
    raises :class:`SnapshotRefused` before anything is written.
    """
    sink: _Target
    if isinstance(target, str):
        if not target.startswith(("postgresql://", "postgres://")):
            raise SnapshotError(
                f"target {target!r}: snapshots load into a SQLite file or postgresql://..."
            )
        # One transaction from the shadow tables to the swap (subscriber/reinit_pg.py).
        from subscriber.reinit_pg import PgShadowLoader

        sink = _PgTarget(PgShadowLoader(target, role=role), subscription)
    else:
        if spark is None:
            raise SnapshotError("loading a snapshot into SQLite needs a Spark session")
        SqliteWriter(target).close()  # creates the metadata tables if missing
        sink = _SqliteTarget(target, spark, subscription)
    own = channel is None
    progress = SnapshotProgress()
    chunks: Generator[Any, None, None] | None = None
    ch: grpc.Channel | None = None
    try:
        ch = channel or _channel(address)
        stream: Any = rpc.ReplicationStub(ch).Snapshot(
            pb.SnapshotRequest(
                subscriber=subscriber, publication=publication, chunk_rows=chunk_rows
            ),
            metadata=metadata,
        )
        if sink.prefetch:
            chunks = _prefetch(stream)
        return _consume(
            chunks if chunks is not None else stream,
            sink,
            publisher=publisher,
            publication=publication,
            progress=progress,
            on_progress=on_progress,
            tables=tables or {},
            spark=spark,
        )
    except grpc.RpcError as e:
        raise SnapshotError(f"snapshot failed: {e.code().name}: {e.details()}") from e
    finally:
        if chunks is not None:
            chunks.close()  # stops the receiving thread, cancels the stream
        sink.close()
        if own and ch is not None:
            ch.close()


class _Target(Protocol):
    """What :func:`_consume` leaves to the target (SQLite or PostgreSQL)."""

    flush_rows: int  # a table's buffer is written once it holds this many rows
    log_fields: Mapping[str, str]  # added to the "snapshot started/loaded" lines
    single_start: bool  # a second ``start`` chunk is an error
    prefetch: bool  # receive the stream in a thread (:func:`_prefetch`)

    def begin(self, start: pb.SnapshotStart) -> None:
        """Create the (empty) shadow tables of ``start.tables``."""

    def buffer(self, table: str, buf: list[Any], rows: Any) -> None:
        """Append a chunk's ``rows`` (protobuf rows) to ``buf``, converted for ``write``."""

    def write(self, table: str, rows: list[Any]) -> int:
        """Write a non-empty buffer into the table's shadow; returns the rows written."""

    def swap(self, start: pb.SnapshotStart, recorded: Mapping[str, pb.TableSchema]) -> None:
        """Replace the tables and level with the shadows' in one transaction, and the
        subscription's schemas with ``recorded`` (the published ones)."""

    def close(self) -> None: ...


def _consume(
    chunks: Iterable[Any],
    target: _Target,
    *,
    publisher: str,
    publication: str,
    progress: SnapshotProgress,
    on_progress: Callable[[SnapshotProgress], None] | None,
    tables: Mapping[str, TableOptions],
    spark: SparkSession | None,
) -> tuple[str, int]:
    """Load a Snapshot stream (start, rows..., end) into ``target``; (incarnation, seq).

    Buffers and the target's tables go by target table name (a table with
    transforms may load into another); rows received are counted by published name.
    """
    from subscriber.reinit_shape import Shape, shape_rows, shapes

    start: pb.SnapshotStart | None = None
    buffers: dict[str, list[Any]] = {}
    received: dict[str, int] = {}
    shaped: dict[str, Shape] = {}
    into: dict[str, str] = {}  # published table -> target table

    def flush(table: str) -> None:
        rows = buffers[table]
        if not rows:
            return
        n = target.write(table, rows)
        progress.rows_loaded += n
        buffers[table] = []
        if on_progress is not None:
            on_progress(progress)

    for chunk in chunks:
        kind = chunk.WhichOneof("kind")
        if kind == "start":
            if start is not None and target.single_start:
                raise SnapshotError("the snapshot started twice")
            start = chunk.start
            _check_publisher(start, publisher)
            shaped = shapes(spark, start, tables) if tables else {}
            loading = pb.SnapshotStart()
            loading.CopyFrom(start)
            progress.seq = start.seq
            progress.rows_expected = 0
            buffers, received, into = {}, {}, {}
            for t, published in zip(loading.tables, start.tables, strict=True):
                name = published.schema.table
                if name in shaped:
                    t.schema.CopyFrom(shaped[name].target)
                into[name] = t.schema.table
                buffers[t.schema.table] = []
                received[name] = 0
                progress.rows_expected += t.expected_rows
            target.begin(loading)
            log.info(
                "snapshot started",
                publication=publication,
                seq=start.seq,
                tables=len(buffers),
                rows=progress.rows_expected,
                **target.log_fields,
            )
        elif kind == "rows":
            table = chunk.rows.table
            if start is None or table not in into:
                raise SnapshotError(f"snapshot rows for unknown table {table!r}")
            rows: Any = chunk.rows.rows
            received[table] += len(rows)
            if table in shaped:
                assert spark is not None  # shapes() refused a shaped table without one
                rows = shape_rows(spark, shaped[table], start.seq, rows)
            name = into[table]
            buf = buffers[name]
            target.buffer(name, buf, rows)
            if len(buf) >= target.flush_rows:
                flush(name)
        elif kind == "end":
            if start is None:
                raise SnapshotError("snapshot ended before it started")
            for table in buffers:
                flush(table)
            expected = {t.schema.table: t.expected_rows for t in start.tables}
            if received != expected:
                raise SnapshotError(
                    f"snapshot incomplete: received {received}, expected {expected}"
                )
            target.swap(start, {t.schema.table: t.schema for t in start.tables})
            log.info(
                "snapshot loaded",
                publication=publication,
                seq=start.seq,
                rows=progress.rows_loaded,
                seconds=round(time.monotonic() - progress.started, 2),
                **target.log_fields,
            )
            return start.incarnation, start.seq
    raise SnapshotError("the snapshot stream ended without its end marker")


class _SqliteTarget:
    """Shadow tables in the SQLite file, each chunk passed through Spark."""

    def __init__(self, path: Path, spark: SparkSession, subscription: str) -> None:
        self.flush_rows = FLUSH_ROWS
        self.log_fields: Mapping[str, str] = {}
        self.single_start = False
        self.prefetch = False
        self.spark = spark
        self.subscription = subscription
        self.schemas: dict[str, pb.TableSchema] = {}
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=60)

    def begin(self, start: pb.SnapshotStart) -> None:
        for t in start.tables:
            self.schemas[t.schema.table] = t.schema
            shadow = SHADOW_PREFIX + t.schema.table
            self.conn.execute(f"DROP TABLE IF EXISTS {quote(shadow)}")
            self.conn.execute(_ddl(shadow, t.schema))

    def buffer(self, table: str, buf: list[Any], rows: Any) -> None:
        buf.extend(tuple(sqlite_value(decode(v)) for v in r.values) for r in rows)

    def write(self, table: str, rows: list[Any]) -> int:
        n = len(self.schemas[table].columns)
        rows = _pass(self.spark, rows, n)
        marks = ", ".join("?" * n)
        self.conn.execute("BEGIN")
        self.conn.executemany(f"INSERT INTO {quote(SHADOW_PREFIX + table)} VALUES ({marks})", rows)
        self.conn.execute("COMMIT")
        return len(rows)

    def swap(self, start: pb.SnapshotStart, recorded: Mapping[str, pb.TableSchema]) -> None:
        try:
            _swap(self.conn, self.subscription, start, list(self.schemas), recorded)
        except SnapshotError:
            # Refused as loaded (a rerun would load them again): leave no copy behind.
            for table in self.schemas:
                self.conn.execute(f"DROP TABLE IF EXISTS {quote(SHADOW_PREFIX + table)}")
            raise

    def close(self) -> None:
        self.conn.close()


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    )


def _check_publisher(start: pb.SnapshotStart, publisher: str) -> None:
    if start.publisher != publisher:
        raise SnapshotError(
            f"snapshot came from publisher {start.publisher!r}, expected {publisher!r}"
        )


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


def _prefetch(stream: Any, depth: int = 4) -> Generator[Any, None, None]:
    """Receive the stream in a thread, ``depth`` chunks ahead of the consumer.

    The publisher then encodes the next chunks while this process decodes and
    COPYs the current one (two processes, two cores) instead of taking turns.
    """
    items: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item: object) -> None:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def receive() -> None:
        try:
            for item in stream:
                put(item)
                if stop.is_set():
                    return
            put(done)
        except BaseException as exc:  # handed to the consumer
            put(exc)

    thread = threading.Thread(target=receive, name="txrepl-snapshot-receive", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        cancel = getattr(stream, "cancel", None)
        if cancel is not None:
            cancel()
        thread.join(5)


class _PgTarget:
    """The PostgreSQL target: one transaction from the shadow tables to the swap."""

    def __init__(self, loader: PgShadowLoader, subscription: str) -> None:
        self.flush_rows = PG_FLUSH_ROWS
        self.log_fields: Mapping[str, str] = {"target": "postgresql"}
        self.single_start = True
        self.prefetch = True
        self.loader = loader
        self.subscription = subscription

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

    def swap(self, start: pb.SnapshotStart, recorded: Mapping[str, pb.TableSchema]) -> None:
        self.loader.swap(self.subscription, start.incarnation, start.seq, recorded)

    def close(self) -> None:
        self.loader.close()


def _swap(
    conn: sqlite3.Connection,
    subscription: str,
    start: pb.SnapshotStart,
    tables: Sequence[str],
    recorded: Mapping[str, pb.TableSchema],
) -> None:
    """Step 3 of the module docstring: one transaction swaps ``tables`` (their
    shadows in), records the ``recorded`` schemas and sets the level."""
    now = dt.datetime.now(dt.UTC).isoformat()
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Indexes and triggers an operator made on the old tables (their SQL names
        # the table, which the shadow is renamed to); automatic indexes have no SQL.
        carried = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE type IN"
            " ('index', 'trigger') AND sql IS NOT NULL AND tbl_name IN"
            f" ({', '.join('?' * len(tables))}) ORDER BY type, name",
            list(tables),
        ).fetchall()
        for table in tables:
            conn.execute(f"DROP TABLE IF EXISTS {quote(table)}")
            conn.execute(f"ALTER TABLE {quote(SHADOW_PREFIX + table)} RENAME TO {quote(table)}")
        for kind, name, table, statement in carried:
            try:
                conn.execute(statement)
            except sqlite3.Error as exc:
                raise SnapshotError(
                    f"cannot carry {kind} {name!r} of {table!r} over to the new table: {exc};"
                    " drop it or make it fit the published columns, then run the reinit again"
                ) from exc
        conn.execute("DELETE FROM txrepl_schemas WHERE subscription = ?", (subscription,))
        conn.executemany(
            "INSERT INTO txrepl_schemas (subscription, table_name, schema, updated_at)"
            " VALUES (?, ?, ?, ?)",
            [(subscription, t, s.SerializeToString(), now) for t, s in recorded.items()],
        )
        conn.execute(
            "INSERT INTO txrepl_subscriptions (subscription, incarnation, level, updated_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (subscription) DO UPDATE SET"
            " incarnation = excluded.incarnation, level = excluded.level,"
            " updated_at = excluded.updated_at",
            (subscription, start.incarnation, start.seq, now),
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
