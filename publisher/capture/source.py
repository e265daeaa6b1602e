"""The Source protocol: what the publisher asks of a source database.

A source turns the source database's committed transactions into entries of
publication logs.  The daemon and publisher/snapshot.py know only this protocol;
each dialect implements it in its own package (``publisher.capture.sqlite``,
``publisher.capture.postgres``) and registers a factory in
``publisher.capture.dialects``.

The four operations and what each must guarantee:

``install(publication, incarnation, tables)``
    Capture ``tables`` for the publication from now on, its schema recorded, and
    arrange for the tables' current rows (a schema op, then the rows) to reach
    the log before any later change of them.  Idempotent for the same
    incarnation; a new incarnation (a re-created log) gets schema and rows again.
    A missing table, or one without a primary key, is refused with a
    SourceError naming it.  Returns the tables newly added.
``stream(pubs, halt)``
    Blocking, until ``halt`` is set: append every committed source transaction,
    whole and in commit order, to the logs of the publications holding its
    tables (an entry never holds part of a transaction), each entry with the
    transaction's ``source_position``.  Resumes after the position of each log's
    newest entry, so a restart neither loses nor repeats a transaction.  Retries
    transient failures itself (with :class:`common.backoff.Backoff`).
``snapshot(pub, timeout_s=...)``
    A context manager pinning a consistent seq S of ``pub``: the rows it yields
    are exactly the source tables' state after the log's entries up to S.
    ``timeout_s`` bounds the wait for capture (to start; to reach the pinned position).
    Needs ``stream`` to be running (it aligns the snapshot with the stream).
``release()``
    Close what the source holds (connections; temporary slots go with them).

``entries`` counts the entries appended so far (a metric); ``health``
(:class:`~publisher.capture.health.CaptureHealth`) is what ``stream`` reports of
its attempts: the daemon's health service, metrics and ``txrepl status`` read it;
``slot_lag()`` what a source read through a replication slot holds back (metrics).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Literal, Protocol

from common.dburl import DatabaseUrl
from common.rpc import txrepl_pb2 as pb
from publisher.capture.health import CaptureHealth
from publisher.publication import Publication

__all__ = ["Snapshot", "Source", "SourceFactory", "SourceOptions"]

ChunkReader = Callable[[pb.TableSchema, int], Iterator[pb.SnapshotChunk]]
# (chunk_rows, copy): every table's chunks, interleaved; copy: COPY text where it can.
AllReader = Callable[[int, bool], Iterator[pb.SnapshotChunk]]


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Settings of a source that are not in its URL (from the publisher's config)."""

    slot: str = "txrepl"  # PostgreSQL: the replication slot
    plugin: Literal["pgoutput", "wal2json"] = "pgoutput"  # PostgreSQL: logical decoding
    poll_interval_s: float = 0.005  # SQLite: the fallback poll (wake.py wakes it on writes)
    max_entry_bytes: int = 4 * 1024 * 1024  # fragments beyond (common/fragments.py)
    snapshot_readers: int = 2  # PostgreSQL: pieces of a snapshot read at a time
    snapshot_range_rows: int = 1_000_000  # PostgreSQL: a bigger table is read in key ranges


@dataclasses.dataclass
class Snapshot:
    """A pinned snapshot: seq S, each table's schema and row count, and its rows.

    ``chunks(schema, chunk_rows)`` yields SnapshotChunks of at most ``chunk_rows``
    rows of that table, as of S (read from the source while the snapshot is held).
    ``every`` (optional), given: ``every(chunk_rows, copy)`` yields the chunks of
    all the tables, interleaved (read in parallel), as PostgreSQL COPY text when
    ``copy`` (SnapshotRows.copy_text).
    """

    seq: int
    tables: list[tuple[pb.TableSchema, int]]
    chunks: ChunkReader
    every: AllReader | None = None
    # The source's sequence positions, read after the rows (PostgreSQL: _sequences.py)
    sequences: Callable[[], list[pb.SequencePosition]] | None = None


class Source(Protocol):
    """A source database behind capture (see the module docstring)."""

    dialect: str

    @property
    def entries(self) -> int: ...

    @property
    def health(self) -> CaptureHealth: ...

    def slot_lag(self) -> tuple[str, int, float] | None:
        """(slot, bytes, seconds) of a source read through a replication slot, else None."""

    def install(self, publication: str, incarnation: str, tables: Sequence[str]) -> list[str]: ...

    def stream(self, pubs: Sequence[Publication], halt: threading.Event) -> None: ...

    def snapshot(
        self, pub: Publication, *, timeout_s: float
    ) -> AbstractContextManager[Snapshot]: ...

    def release(self) -> None: ...


SourceFactory = Callable[[DatabaseUrl, SourceOptions], Source]
