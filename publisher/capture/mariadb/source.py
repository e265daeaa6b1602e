"""MariadbSource: the Source protocol over the binary log of a MariaDB/MySQL server.

Streaming runs :class:`~publisher.capture.mariadb._stream.Session` and starts a new
one with :data:`RETRY` when it fails (the server restarts, the network blips).

Snapshot at a consistent seq S (``txrepl subscriber reinit``, publisher/snapshot.py):

1. Pin a consistent snapshot and read the GTID position G it is as of (_gtid.py).
2. Wait until the stream has dealt with every transaction up to G: each is then in
   the log (or held nothing for the publication), and nothing after G can be yet
   unless the stream is already past it.  The log is flushed (the stream appends
   without waiting for durability, and only durable entries are visible), then S =
   the highest seq whose entry's position is at or below G (``last_before``;
   positions never decrease along a log).
3. Read the tables in the pinned transaction: their rows are the state as of S.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import structlog

from common.backoff import Backoff
from common.dburl import DatabaseUrl
from common.rpc import txrepl_pb2 as pb
from publisher.capture.health import CaptureHealth, keep_streaming
from publisher.capture.logs import last_before
from publisher.capture.mariadb import _catalog as catalog
from publisher.capture.mariadb._gtid import pinned, position, seq_of
from publisher.capture.mariadb._stream import BinlogCapture, Session
from publisher.capture.source import Snapshot, SourceOptions
from publisher.publication import Publication

__all__ = ["RETRY", "MariadbSource"]

log = structlog.get_logger(__name__)

# 0.4 s, doubling, at most 10 s before capture is started again after a failure.
RETRY = Backoff(initial_s=0.4, max_s=10.0, jitter=0.0)


class MariadbSource:
    """Capture from MariaDB through its binary log (see the package docstring)."""

    dialect = "mariadb"

    def __init__(self, capture: BinlogCapture) -> None:
        self.capture = capture

    @classmethod
    def open(cls, url: DatabaseUrl, options: SourceOptions) -> MariadbSource:
        """Connect and check the server (binary log settings, one GTID domain)."""
        return cls(BinlogCapture(url, options))

    @property
    def entries(self) -> int:
        return self.capture.entries

    @property
    def health(self) -> CaptureHealth:
        return self.capture.health

    def slot_lag(self) -> tuple[str, int, float] | None:
        return None

    def install(self, publication: str, incarnation: str, tables: Sequence[str]) -> list[str]:
        """Record ``tables`` for ``publication``; new ones get schema + rows (package docstring)."""
        names = [catalog.mariadb_table(t) for t in tables]
        conn = catalog.connect(self.capture.url)
        try:
            for t in names:
                catalog.read_shape(conn, t, check=True)
            have = catalog.installs(conn)
            keep = [t for t in names if have.get((publication, t), ("",))[0] == incarnation]
            added = [t for t in names if t not in keep]
            catalog.record_install(conn, publication, incarnation, keep, added)
        finally:
            conn.close()
        if added:
            self.capture.changed.set()
            log.info("capture install recorded", publication=publication, tables=added)
        return added

    def release(self) -> None:
        """Nothing is held between sessions (a session closes its own connections)."""

    def stream(self, pubs: Sequence[Publication], halt: threading.Event) -> None:
        keep_streaming(
            lambda: Session(self.capture, pubs).run(halt),
            self.capture.health,
            halt,
            what="MariaDB capture",
            retry=RETRY,
        )

    @contextmanager
    def snapshot(self, pub: Publication, *, timeout_s: float = 60.0) -> Iterator[Snapshot]:
        """Steps 1-3 of the module docstring."""
        cap = self.capture
        with catalog.connect(cap.url) as conn:
            have = catalog.installs(conn)
        tables = sorted(
            t
            for (name, t), (inc, g) in have.items()
            if name == pub.name and inc == pub.log.incarnation and g is not None
        )
        with pinned(cap.url, cap.domain) as pin:
            cap.wait_done(seq_of(pin.pos), timeout_s)
            # The capture appends without waiting for durability: the entries up to the
            # snapshot's GTID are durable, so visible to last_before, once flushed.
            pub.log.flush()
            seq = last_before(pub, position(0, seq_of(pin.pos) + 1))
            shapes = {t: catalog.read_shape(pin.conn, t).schema for t in tables}
            by_name = {s.table: t for t, s in shapes.items()}

            def chunks(schema: pb.TableSchema, chunk_rows: int) -> Iterator[pb.SnapshotChunk]:
                return pin.chunks(by_name[schema.table], chunk_rows)

            yield Snapshot(seq, [(shapes[t], pin.count(t)) for t in tables], chunks)
