"""Consistent snapshots of a publication's tables, aligned with one seq S.

The source pins S and reads the rows (``Source.snapshot``: each source's module
has its argument for why S is exact: publisher/capture/sqlite/source.py,
publisher/capture/postgres/source.py); this module turns a pinned snapshot into
the stream of chunks the ``Snapshot`` RPC sends::

    SnapshotStart (publisher, publication, incarnation, S, each table's schema
                   and row count), SnapshotRows..., SnapshotEnd (S, rows sent)

A publication's filters and column lists (publisher/shaping.py) apply here too: each
shaped table's schema is projected, its rows filtered and projected before they are
sent, and its row count is that of the filtered rows (counted by a first read of the
pinned rows: a shaped table with a filter is read twice, never held in memory).

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
from publisher.shaping import BoundShape

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


def _count(chunks: Iterable[pb.SnapshotChunk], shape: BoundShape) -> int:
    if shape.filter is None:
        return sum(len(c.rows.rows) for c in chunks)
    return sum(1 for c in chunks for r in c.rows.rows if shape.passes(r.values))


def _shaped(chunk: pb.SnapshotChunk, shape: BoundShape) -> pb.SnapshotChunk:
    """The chunk's rows that pass the filter, projected to the published columns."""
    out = pb.SnapshotChunk()
    out.rows.table = chunk.rows.table
    for row in chunk.rows.rows:
        if shape.passes(row.values):
            out.rows.rows.add().values.extend(shape.project(row.values))
    return out


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
            bound = {
                s.table: pub.shaper.tables[s.table].bind(s)
                for s, _ in snap.tables
                if s.table in pub.shaper.tables
            }
            tables = [
                (bound[s.table].schema, _count(snap.chunks(s, chunk_rows), bound[s.table]))
                if s.table in bound
                else (s, n)
                for s, n in snap.tables
            ]
            yield self._start_chunk(pub, snap.seq, tables)
            total = 0
            if snap.every is not None and not bound:
                # parallel reads, COPY text if asked; shaped tables take the value path
                chunks: Iterable[pb.SnapshotChunk] = snap.every(chunk_rows, copy)
            else:
                chunks = (
                    _shaped(c, bound[schema.table]) if schema.table in bound else c
                    for schema, _ in snap.tables
                    for c in snap.chunks(schema, chunk_rows)
                )
            for chunk in chunks:
                total += len(chunk.rows.rows) + chunk.rows.copy_rows
                yield chunk
            end = _end_chunk(pub, snap.seq, total, started, source=self.source.dialect)
            if snap.sequences is not None:
                end.end.sequences.extend(snap.sequences())
            yield end

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
