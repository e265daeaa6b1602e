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
   connection per table, each importing the snapshot while the slot's
   connection still holds it), then drop the temporary slot (on leaving the
   context).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg
import structlog
from psycopg import sql

from common.backoff import Backoff
from common.dburl import DatabaseUrl
from common.rpc import txrepl_pb2 as pb
from publisher.capture.health import CaptureHealth
from publisher.capture.postgres._partitions import select_from
from publisher.capture.postgres._pgcatalog import TableName, TableShape
from publisher.capture.postgres._pgtypes import SESSION_GUCS, to_value
from publisher.capture.postgres.capture import PostgresCapture
from publisher.capture.source import Snapshot, SourceOptions
from publisher.capture.values import rows_chunk
from publisher.errors import SourceError
from publisher.publication import Publication

__all__ = ["RETRY", "PostgresSource"]

log = structlog.get_logger(__name__)

# 0.4 s, doubling, at most 10 s before capture is started again after a failure.
RETRY = Backoff(initial_s=0.4, max_s=10.0, jitter=0.0)


class PostgresSource:
    """Capture from PostgreSQL through a logical replication slot."""

    dialect = "postgresql"

    def __init__(self, capture: PostgresCapture) -> None:
        self.capture = capture

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
        return cls(capture)

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
        failures = 0
        while not halt.is_set():
            try:
                self.capture.run(pubs, halt)
                failures = 0
            except Exception as e:  # the source restarts, the network blips: keep trying
                failures += 1
                self.capture.health.failed(e)
                log.error("PostgreSQL capture failed; retrying", error=str(e), failures=failures)
                halt.wait(RETRY.delay(failures))

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
                for t in tables:
                    rows = select_from(conn, t.sql)  # with its partitions (_partitions.py)
                    row = conn.execute(f"SELECT count(*) FROM {rows}").fetchone()
                    counts.append(int(row[0]) if row else 0)
                conn.rollback()
            seq = cap.wait_position(pending.lsn, timeout_s)[pub.name]
            by_name: dict[str, tuple[TableName, TableShape]] = {
                shape.schema.table: (t, shape) for t, shape in zip(tables, shapes, strict=True)
            }

            def chunks(schema: pb.TableSchema, chunk_rows: int) -> Iterator[pb.SnapshotChunk]:
                t, shape = by_name[schema.table]
                infos = shape.infos
                with contextlib.closing(cap._read_snapshot(pending, t, lambda: None)) as it:
                    read_shape, _ = next(it)
                    if read_shape.schema != shape.schema:
                        raise SourceError(f"table {t.display!r} changed while it was read")
                    for _, rows in it:
                        for i in range(0, len(rows), chunk_rows):
                            part = rows[i : i + chunk_rows]
                            chunk = rows_chunk(shape.schema.table)
                            add = chunk.rows.rows.add
                            for r in part:
                                add().values.extend(
                                    to_value(d, info) for d, info in zip(r, infos, strict=True)
                                )
                            yield chunk

            yield Snapshot(
                seq, [(shape.schema, n) for shape, n in zip(shapes, counts, strict=True)], chunks
            )
        finally:
            pending.conn.close()  # drops the temporary slot
