"""The Snapshot stream client: read a publisher snapshot and drive a target's loader.

A re-initialisation loads the content of every published table, as of exactly
one seq S, into the target, then sets the subscription's level to S; the
subscriber resumes from S + 1.  This module reads the ``Snapshot`` stream
(start, rows..., end), checks it (the publisher, the row counts, one start),
shapes the rows of tables with transforms (:mod:`subscriber.reinit.shape`) and
hands them, in buffers of ``flush_rows``, to a :class:`ShadowLoader`: each
target's loader (``subscriber.targets.<dialect>.snapshot``) fills shadow tables
and swaps them in, with the level, in one target transaction; its module
docstring carries its own atomicity argument.  Which loader a target URL gets,
and the builder shared by ``txrepl subscriber reinit`` and the daemon, are in
:mod:`subscriber.targets`.

A table with transforms (``[apply.tables.<table>]``) is loaded into its target
table, shaped as the apply shapes its changes; the recorded schemas stay the
published ones, from which the apply derives the target's.  A table in history
mode is refused before anything is written (:class:`SnapshotRefused`): the
snapshot would replace the versions it keeps with the current rows.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import structlog

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import client_channel
from subscriber.apply import TableOptions
from subscriber.reinit.errors import SnapshotError
from subscriber.reinit.shape import Shape, shape_rows, shapes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ShadowLoader", "SnapshotProgress", "load_into"]

log = structlog.get_logger(__name__)


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


def load_into(
    sink: ShadowLoader,
    *,
    address: str,
    publisher: str,
    publication: str,
    subscriber: str,
    spark: SparkSession | None = None,
    channel: grpc.Channel | None = None,
    on_progress: Callable[[SnapshotProgress], None] | None = None,
    chunk_rows: int = 5000,
    tables: Mapping[str, TableOptions] | None = None,
) -> tuple[str, int]:
    """Load the publication's snapshot through ``sink``; returns (incarnation, seq).

    ``sink`` is closed when this returns or raises.  ``tables``: the subscriber's
    per-table options (``ApplyOptions.tables``); a table with transforms is loaded
    shaped (``spark`` required), one in history mode raises
    :class:`SnapshotRefused` before anything is written.  ``channel``: the caller's
    (TLS and token, built by ``subscriber.targets.publisher_channel``); without it a
    plaintext one to ``address``, with no token.
    """
    own = channel is None
    progress = SnapshotProgress()
    chunks: Generator[Any, None, None] | None = None
    ch: grpc.Channel | None = None
    try:
        ch = channel or client_channel(address, None)  # plaintext: tests, loopback
        # COPY text only when every table loads as published (no Spark shaping).
        copy = sink.copy_text and not any(t.shaped for t in (tables or {}).values())
        stream: Any = rpc.ReplicationStub(ch).Snapshot(
            pb.SnapshotRequest(
                subscriber=subscriber,
                publication=publication,
                chunk_rows=chunk_rows,
                accept_copy_text=copy,
            ),
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


class ShadowLoader(Protocol):
    """What :func:`load_into` leaves to a target: shadow tables, then one swap."""

    flush_rows: int  # a table's buffer is written once it holds this many rows
    log_fields: Mapping[str, str]  # added to the "snapshot started/loaded" lines
    single_start: bool  # a second ``start`` chunk is an error
    prefetch: bool  # receive the stream in a thread (:func:`_prefetch`)
    copy_text: bool  # takes PostgreSQL COPY text (``write_copy``)

    def begin(self, start: pb.SnapshotStart) -> None:
        """Create the (empty) shadow tables of ``start.tables``."""

    def buffer(self, table: str, buf: list[Any], rows: Any) -> None:
        """Append a chunk's ``rows`` (protobuf rows) to ``buf``, converted for ``write``."""

    def write(self, table: str, rows: list[Any]) -> int:
        """Write a non-empty buffer into the table's shadow; returns the rows written."""

    def write_copy(self, table: str, text: bytes) -> None:
        """Write whole lines of PostgreSQL COPY text into the table's shadow."""

    def swap(self, start: pb.SnapshotStart, recorded: Mapping[str, pb.TableSchema]) -> None:
        """Replace the tables and level with the shadows' in one transaction, and the
        subscription's schemas with ``recorded`` (the published ones)."""

    def close(self) -> None: ...


def _consume(
    chunks: Iterable[Any],
    target: ShadowLoader,
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
            if on_progress is not None:
                on_progress(progress)  # 0 of n rows: the load is under way
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
            if chunk.rows.copy_rows:
                if table in shaped or not target.copy_text:
                    raise SnapshotError(f"snapshot sent COPY text for table {table!r} unasked")
                received[table] += chunk.rows.copy_rows
                target.write_copy(into[table], chunk.rows.copy_text)
                progress.rows_loaded += chunk.rows.copy_rows
                if on_progress is not None:
                    on_progress(progress)
                continue
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
            if hasattr(target, "sequence_positions"):  # PostgreSQL: moved with the swap
                target.sequence_positions = {
                    (p.table, p.column): p.last_value
                    for p in chunk.end.sequences
                    if p.table in into and into[p.table] == p.table  # not shaped
                }
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


def _check_publisher(start: pb.SnapshotStart, publisher: str) -> None:
    if start.publisher != publisher:
        raise SnapshotError(
            f"snapshot came from publisher {start.publisher!r}, expected {publisher!r}"
        )


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
