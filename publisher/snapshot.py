"""Consistent snapshots of a publication's tables, aligned with one seq S.

The source pins S and reads the rows (``Source.snapshot``: each source's module
has its argument for why S is exact: publisher/capture/sqlite/source.py,
publisher/capture/postgres/source.py); this module turns a pinned snapshot into
the stream of chunks the ``Snapshot`` RPC sends::

    SnapshotStart (publisher, publication, incarnation, S, each table's schema
                   and row count), SnapshotRows..., SnapshotEnd (S, rows sent)

Entries appended through ``Publish`` carry application data, not source tables:
they are not part of a snapshot (a subscriber re-initialised from a snapshot gets
them only from S + 1 on).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass

import structlog

from common.rpc import txrepl_pb2 as pb
from publisher.capture.source import Source
from publisher.publication import Publication

__all__ = ["SnapshotSource"]

log = structlog.get_logger(__name__)

DEFAULT_CHUNK_ROWS = 5000
MAX_CHUNK_ROWS = 100_000


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
    """Snapshots of ``publications`` from ``source``, once its capture runs."""

    server_name: str
    source: Source
    publications: Mapping[str, Publication]
    running: bool = False  # set once the source streams (snapshots align with it)
    position_timeout_s: float = 60.0

    @property
    def ready(self) -> bool:
        return self.running

    def stream(
        self, pub: Publication, chunk_rows: int, *, copy: bool = False
    ) -> Generator[pb.SnapshotChunk, None, None]:
        """Yield SnapshotStart, SnapshotRows..., SnapshotEnd (blocking; run in a thread).

        ``copy``: the subscriber takes PostgreSQL COPY text (a source that reads its
        tables in parallel then sends that; its tables' chunks interleave)."""
        chunk_rows = min(MAX_CHUNK_ROWS, chunk_rows or DEFAULT_CHUNK_ROWS)
        started = time.monotonic()
        with self.source.snapshot(pub, timeout_s=self.position_timeout_s) as snap:
            yield self._start_chunk(pub, snap.seq, snap.tables)
            total = 0
            if snap.every is not None:
                chunks: Iterable[pb.SnapshotChunk] = snap.every(chunk_rows, copy)
            else:
                chunks = (c for schema, _ in snap.tables for c in snap.chunks(schema, chunk_rows))
            for chunk in chunks:
                total += len(chunk.rows.rows) + chunk.rows.copy_rows
                yield chunk
            yield _end_chunk(pub, snap.seq, total, started, source=self.source.dialect)

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
