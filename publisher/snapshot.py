"""Consistent snapshots of a publication's tables, aligned with one seq S.

SQLite source — how S is made exact:

1. Take the capture lock: no capture step runs meanwhile.
2. Open a read transaction on the source and read P, the highest capture id
   ever handed out (``sqlite_sequence``).  In WAL mode this transaction pins a
   snapshot holding exactly the changes whose capture ids are <= P (triggers
   write the capture row in the writer's own transaction, and ids follow commit
   order because SQLite serialises writers).
3. Run one capture step limited to ids <= P: every change in the snapshot is now
   in the log, and nothing after it.  S = the publication's head.
4. Release the capture lock (capture goes on with ids > P) and stream the tables
   from the still-open read transaction: their content is exactly the state as
   of S.

PostgreSQL source (publisher/capture/postgres.py has the argument in full):

1. Create a temporary logical slot with an exported snapshot; its consistent
   point ``C`` splits the source's transactions: commit LSN ``< C`` visible in
   the snapshot, ``>= C`` not.
2. Import the snapshot in a REPEATABLE READ transaction (shapes, row counts),
   then wait until the capture stream reaches ``C``: S = the highest seq whose
   entry's position (its commit LSN) is ``< C``.
3. Stream each table under the same snapshot (``COPY ... TO STDOUT``, one
   connection per table, each importing the snapshot while the slot's
   connection still holds it), then drop the temporary slot.

Entries appended through ``Publish`` carry application data, not source tables:
they are not part of a snapshot (a subscriber re-initialised from a snapshot gets
them only from S + 1 on).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass

import structlog
from psycopg import sql

from common.rpc import txrepl_pb2 as pb
from common.values import _natural, _to_datetime, _to_decimal, encode
from publisher.capture.postgres import PostgresCapture
from publisher.capture.sqlite import SqliteCapture, _q
from publisher.capture.thread import CaptureThread
from publisher.errors import SourceError
from publisher.publication import Publication

__all__ = ["SnapshotSource", "value_writer"]

log = structlog.get_logger(__name__)

DEFAULT_CHUNK_ROWS = 5000
MAX_CHUNK_ROWS = 100_000


_INTEGER = pb.COLUMN_TYPE_INTEGER
_FLOAT = pb.COLUMN_TYPE_FLOAT
_TEXT = pb.COLUMN_TYPE_TEXT
_DECIMAL = pb.COLUMN_TYPE_DECIMAL
_TIMESTAMP = pb.COLUMN_TYPE_TIMESTAMP
_TIMESTAMPTZ = pb.COLUMN_TYPE_TIMESTAMPTZ


def value_writer(ctype: int, scale: int) -> Callable[[pb.Value, object], None]:
    """``write(out, v)``: set ``out`` to exactly what ``encode(v, ctype, scale)`` returns.

    The snapshot's hot loop: the common cases are set in place (no Value built and
    copied, no walk through every logical type); anything else goes through
    :func:`common.values.encode` itself.
    """

    def generic(out: pb.Value, v: object) -> None:
        out.CopyFrom(encode(v, ctype, scale))

    if ctype in (_INTEGER, _FLOAT, _TEXT):
        exact, field = (
            (int, "int")
            if ctype == _INTEGER
            else (float, "float")
            if ctype == _FLOAT
            else (str, "text")
        )

        def simple(out: pb.Value, v: object) -> None:
            if type(v) is exact:
                setattr(out, field, v)
            elif v is None:
                out.null = True
            else:
                generic(out, v)

        return simple
    if ctype == _DECIMAL:

        def dec(out: pb.Value, v: object) -> None:
            if v is None:
                out.null = True
                return
            d = _to_decimal(v, scale)
            if d is None:
                generic(out, v)
            else:
                out.decimal = str(d)

        return dec
    if ctype in (_TIMESTAMP, _TIMESTAMPTZ):
        zoned = ctype == _TIMESTAMPTZ

        def stamp(out: pb.Value, v: object) -> None:
            if v is None:
                out.null = True
                return
            ts = _to_datetime(v)
            if ts is None:
                generic(out, v)
                return
            if zoned and ts.tzinfo is None:
                ts = ts.replace(tzinfo=dt.UTC)
            _natural(ts, out)

        return stamp
    return generic


def _rows_chunk(table: str) -> pb.SnapshotChunk:
    """An empty rows chunk of ``table`` (the caller adds the rows in its own hot loop)."""
    chunk = pb.SnapshotChunk()
    chunk.rows.table = table
    return chunk


def _end_chunk(
    pub: Publication, seq: int, total: int, started: float, **fields: str
) -> pb.SnapshotChunk:
    """The stream's last chunk (S and the rows sent), logged as sent."""
    end = pb.SnapshotChunk()
    end.end.seq = seq
    end.end.rows = total
    log.info(
        "snapshot sent",
        publication=pub.name,
        seq=seq,
        rows=total,
        **fields,
        seconds=round(time.monotonic() - started, 3),
    )
    return end


@dataclass
class SnapshotSource:
    server_name: str
    capture: SqliteCapture | None
    publications: Mapping[str, Publication]
    capture_thread: CaptureThread | None = None
    pg_capture: PostgresCapture | None = None
    pg_running: bool = False  # set once PostgreSQL capture streams
    position_timeout_s: float = 60.0

    @property
    def ready(self) -> bool:
        return self.capture_thread is not None or (self.pg_capture is not None and self.pg_running)

    def stream(self, pub: Publication, chunk_rows: int) -> Generator[pb.SnapshotChunk, None, None]:
        """Yield SnapshotStart, SnapshotRows..., SnapshotEnd (blocking; run in a thread)."""
        chunk_rows = min(MAX_CHUNK_ROWS, chunk_rows or DEFAULT_CHUNK_ROWS)
        if self.pg_capture is not None:
            yield from self._stream_pg(self.pg_capture, pub, chunk_rows)
            return
        assert self.capture is not None
        started = time.monotonic()
        # Consumed chunk by chunk from worker threads, one at a time: never concurrently.
        conn = sqlite3.connect(
            str(self.capture.path), isolation_level=None, timeout=30, check_same_thread=False
        )
        try:
            seq, schemas, counts = self._pin(conn, pub)
            yield self._start_chunk(pub, seq, [(s, counts[s.table]) for s in schemas])
            total = 0
            for schema in schemas:
                writers = [value_writer(c.type, c.scale) for c in schema.columns]
                cols = ", ".join(_q(c.name) for c in schema.columns)
                cur = conn.execute(f"SELECT {cols} FROM {_q(schema.table)}")
                while True:
                    rows = cur.fetchmany(chunk_rows)
                    if not rows:
                        break
                    chunk = _rows_chunk(schema.table)
                    add = chunk.rows.rows.add
                    for row in rows:
                        values = add().values
                        for write, v in zip(writers, row, strict=True):
                            write(values.add(), v)
                    total += len(rows)
                    yield chunk
            yield _end_chunk(pub, seq, total, started)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    def _stream_pg(
        self, cap: PostgresCapture, pub: Publication, chunk_rows: int
    ) -> Generator[pb.SnapshotChunk, None, None]:
        """Steps 1-3 of the PostgreSQL part of the module docstring."""
        import psycopg

        from publisher.capture._pgtypes import SESSION_GUCS, to_value

        started = time.monotonic()
        tables = cap.snapshot_tables(pub.name)
        pending = cap.export_snapshot()
        try:
            with psycopg.connect(cap.dsn, options=SESSION_GUCS) as conn:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.read_only = True
                conn.execute(
                    sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(pending.snapshot))
                )
                shapes = [cap.snapshot_shape(conn, t)[0] for t in tables]
                counts = []
                for t in tables:
                    row = conn.execute(f"SELECT count(*) FROM ONLY {t.sql}").fetchone()
                    counts.append(int(row[0]) if row else 0)
                conn.rollback()
            seq = cap.wait_position(pending.lsn, self.position_timeout_s)[pub.name]
            yield self._start_chunk(
                pub, seq, [(shape.schema, n) for shape, n in zip(shapes, counts, strict=True)]
            )
            total = 0
            for t, shape in zip(tables, shapes, strict=True):
                infos = shape.infos
                chunks = cap._read_snapshot(pending, t, lambda: None)
                with contextlib.closing(chunks) as it:
                    read_shape, _ = next(it)
                    if read_shape.schema != shape.schema:
                        raise SourceError(f"table {t.display!r} changed while it was read")
                    for _, rows in it:
                        for i in range(0, len(rows), chunk_rows):
                            part = rows[i : i + chunk_rows]
                            chunk = _rows_chunk(shape.schema.table)
                            add = chunk.rows.rows.add
                            for r in part:
                                add().values.extend(
                                    to_value(d, info) for d, info in zip(r, infos, strict=True)
                                )
                            total += len(part)
                            yield chunk
            yield _end_chunk(pub, seq, total, started, source="postgresql")
        finally:
            pending.conn.close()  # drops the temporary slot

    def _start_chunk(
        self, pub: Publication, seq: int, tables: Iterable[tuple[pb.TableSchema, int]]
    ) -> pb.SnapshotChunk:
        """The stream's first chunk: S and each table's schema with its row count."""
        start = pb.SnapshotChunk()
        start.start.publisher = self.server_name
        start.start.publication = pub.name
        start.start.incarnation = pub.log.incarnation
        start.start.seq = seq
        for schema, n in tables:
            start.start.tables.add(schema=schema, expected_rows=n)
        return start

    def _pin(
        self, conn: sqlite3.Connection, pub: Publication
    ) -> tuple[int, list[pb.TableSchema], dict[str, int]]:
        """Steps 1-4 of the module docstring; leaves ``conn`` in the pinned read transaction."""
        thread = self.capture_thread
        if thread is None or self.capture is None:
            raise RuntimeError("capture is not running yet")
        installed = self.capture.installed().get(pub.name, {})
        tables = [t for t in pub.config.tables if t in installed]
        with thread.lock:
            conn.execute("BEGIN")
            position = self.capture.max_id(conn)  # the first read starts the snapshot
            thread.step(upto=position)
            seq = pub.log.head
        schemas = [self.capture.read_schema(t) for t in tables]
        counts = {
            t: int(conn.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0]) for t in tables
        }
        return seq, schemas, counts
