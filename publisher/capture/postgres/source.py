"""PostgresSource: the Source protocol over log-based capture of PostgreSQL.

Streaming runs :meth:`PostgresCapture.run` (which reconnects lost streams
itself) and starts it again with :data:`RETRY` when it fails otherwise.

Snapshot at a consistent seq S (the package docstring has the argument in full):

1. Create a temporary logical slot with an exported snapshot; its consistent
   point ``C`` splits the source's transactions: commit LSN ``< C`` visible in
   the snapshot, ``>= C`` not.
2. Import the snapshot in a REPEATABLE READ transaction (shapes, row counts),
   then wait until the capture stream reaches ``C``: S = the highest seq whose
   entry's position (its commit LSN) is ``< C``.
3. Read each table under the same snapshot (``COPY ... TO STDOUT``, one
   connection per table, or per key range of a big table, each importing the
   snapshot while the slot's connection still holds it; several at a time:
   _readers.py), then drop the temporary slot (on leaving the context).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
import structlog
from psycopg import sql

from common.backoff import Backoff
from common.dburl import DatabaseUrl
from common.rpc import txrepl_pb2 as pb
from publisher.capture.health import CaptureHealth, keep_streaming
from publisher.capture.postgres._partitions import select_from
from publisher.capture.postgres._pgcatalog import TableName, TableShape
from publisher.capture.postgres._pgtypes import SESSION_GUCS
from publisher.capture.postgres._readers import Piece, key_ranges, read_pieces
from publisher.capture.postgres._sequences import SequencePositions
from publisher.capture.postgres.capture import PostgresCapture
from publisher.capture.source import Snapshot, SourceOptions
from publisher.publication import Publication

__all__ = ["RETRY", "PostgresSource"]

log = structlog.get_logger(__name__)

# 0.4 s, doubling, at most 10 s before capture is started again after a failure.
RETRY = Backoff(initial_s=0.4, max_s=10.0, jitter=0.0)


class PostgresSource:
    """Capture from PostgreSQL through a logical replication slot."""

    dialect = "postgresql"

    def __init__(self, capture: PostgresCapture, options: SourceOptions | None = None) -> None:
        self.capture = capture
        self.options = options or SourceOptions()

    @classmethod
    def open(cls, url: DatabaseUrl, options: SourceOptions) -> PostgresSource:
        """Connect and check the source (wal_level, REPLICATION, slot health): clear errors."""
        capture = PostgresCapture(
            url.raw,
            slot=options.slot,
            plugin=options.plugin,
            max_entry_bytes=options.max_entry_bytes,
        )
        capture.check()
        return cls(capture, options)

    @property
    def entries(self) -> int:
        return self.capture.entries

    @property
    def health(self) -> CaptureHealth:
        return self.capture.health

    def slot_lag(self) -> tuple[str, int, float] | None:
        bytes_, seconds = self.capture.slot_lag()
        return self.capture.slot, bytes_, seconds

    def install(self, publication: str, incarnation: str, tables: Sequence[str]) -> list[str]:
        return self.capture.install(publication, incarnation, tables)

    def release(self) -> None:
        self.capture.close()

    def stream(self, pubs: Sequence[Publication], halt: threading.Event) -> None:
        keep_streaming(
            lambda: self.capture.run(pubs, halt),
            self.capture.health,
            halt,
            what="PostgreSQL capture",
            retry=RETRY,
        )

    @contextmanager
    def snapshot(self, pub: Publication, *, timeout_s: float = 60.0) -> Iterator[Snapshot]:
        """Steps 1-3 of the module docstring."""
        cap = self.capture
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
                pieces: list[Piece] = []
                for t, shape in zip(tables, shapes, strict=True):
                    rows = select_from(conn, t.sql)  # with its partitions (_partitions.py)
                    row = conn.execute(f"SELECT count(*) FROM {rows}").fetchone()
                    counts.append(int(row[0]) if row else 0)
                    pieces += key_ranges(
                        conn, t, shape, counts[-1], self.options.snapshot_range_rows
                    )
                conn.rollback()
            seq = cap.wait_position(pending.lsn, timeout_s)[pub.name]
            by_name: dict[str, tuple[TableName, TableShape]] = {
                shape.schema.table: (t, shape) for t, shape in zip(tables, shapes, strict=True)
            }

            def read(todo: list[Piece], chunk_rows: int, copy: bool) -> Iterator[pb.SnapshotChunk]:
                return read_pieces(
                    cap.dsn,
                    pending.snapshot,
                    todo,
                    lambda c, t: cap.snapshot_shape(c, t)[0],
                    copy=copy,
                    chunk_rows=chunk_rows,
                    readers=self.options.snapshot_readers,
                )

            def chunks(schema: pb.TableSchema, chunk_rows: int) -> Iterator[pb.SnapshotChunk]:
                return read([Piece(*by_name[schema.table])], chunk_rows, False)

            def every(chunk_rows: int, copy: bool) -> Iterator[pb.SnapshotChunk]:
                # Biggest tables first: the last reader to finish has the least left.
                size = {t: n for t, n in zip(tables, counts, strict=True)}
                log.info(
                    "snapshot reading",
                    publication=pub.name,
                    tables=len(tables),
                    pieces=len(pieces),
                    readers=min(self.options.snapshot_readers, len(pieces)),
                    copy_text=copy,
                )
                return read(sorted(pieces, key=lambda p: -size[p.table]), chunk_rows, copy)

            yield Snapshot(
                seq,
                [(shape.schema, n) for shape, n in zip(shapes, counts, strict=True)],
                chunks,
                every,
                lambda: SequencePositions(cap._admin, cap._lock).read(tables),
            )
        finally:
            pending.conn.close()  # drops the temporary slot
