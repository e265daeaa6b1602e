"""SqliteSource: the Source protocol over trigger capture of a SQLite file.

Streaming polls the capture table (``SqliteCapture.read``) whenever SQLite's
``data_version`` says another connection committed.  It checks that right after
any write to the source's files (an inotify watch, ``wake.py``, which says when),
and at least every ``poll_interval_s`` (the fallback, and the only pace where the
source cannot be watched); and again at once after a poll that stopped where the rows'
origin changes (common/origin.py, R2), since the rows it left were committed
already and no later commit may come to say so.  One step, under ``lock``, turns
every captured row so far into at most one entry per publication, then releases
rows every publication has logged (at most once a second, or when many wait:
deleting takes the source's write lock).  Failures are retried with :data:`RETRY`.

Snapshot at a consistent seq S (the lock is what makes S exact):

1. Take the capture lock: no capture step runs meanwhile.
2. Open a read transaction on the source and read P, the highest capture id
   ever handed out (``sqlite_sequence``).  In WAL mode this transaction pins a
   snapshot holding exactly the changes whose capture ids are <= P (triggers
   write the capture row in the writer's own transaction, and ids follow commit
   order because SQLite serialises writers).
3. Run one capture step limited to ids <= P: every change in the snapshot is now
   in the log, and nothing after it.  S = the publication's head.
4. Release the capture lock (capture goes on with ids > P) and read the tables
   from the still-open read transaction: their content is exactly the state as
   of S.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import structlog

from common.backoff import Backoff
from common.dburl import DatabaseUrl
from common.names import format_table, parse_table, unqualified
from common.rpc import txrepl_pb2 as pb
from common.values import sqlite_text_factory
from publisher.capture.calls import CallScope, read_call
from publisher.capture.groups import EncodedEntry, GroupWriter
from publisher.capture.health import CaptureHealth
from publisher.capture.source import Snapshot, SourceOptions
from publisher.capture.sqlite.capture import CapturedRow, SqliteCapture, qident
from publisher.capture.sqlite.exact import stored_writer
from publisher.capture.sqlite.release import Releaser
from publisher.capture.sqlite.wake import Pace, Watch
from publisher.capture.values import rows_chunk, value_writer
from publisher.errors import RowTooLarge, SourceError
from publisher.publication import Publication

__all__ = ["RETRY", "SqliteSource"]

log = structlog.get_logger(__name__)

RELEASE_EVERY_S = 1.0
RELEASE_ROWS = 50_000
# A poll that read a backlog (RELEASE_ROWS rows or more) puts the release off this long
# (counted from the first such poll, so a stream of them still releases every 2 s):
# deleting W1's 235k rows cost the publisher ~0.5 s of CPU on a 2-core machine while
# its subscribers were applying the same backlog (docs/performance.md).
RELEASE_DEFER_S = 2.0
# 0.2 s, doubling, at most 5 s between attempts after a failed step.
RETRY = Backoff(initial_s=0.2, max_s=5.0, jitter=0.0)


def sqlite_table(spec: str) -> str:
    """The SQLite table a configured name (common/names.py) means: no schema."""
    try:
        return unqualified(spec, "a SQLite source has no schemas")
    except ValueError as e:
        raise SourceError(str(e)) from None


class SqliteSource:
    """Capture from a SQLite file through triggers (see the module docstring)."""

    dialect = "sqlite"

    def __init__(
        self,
        path: Path,
        *,
        poll_interval_s: float = 0.005,
        max_entry_bytes: int = SourceOptions.max_entry_bytes,
        watch: bool = True,
    ) -> None:
        self.watch = watch  # False: poll only (the benchmark's comparison, wake.py)
        self.cut = False  # the last step stopped where the origin changes: rows wait
        self.health = CaptureHealth()  # the streaming loop and the capture's lock waits
        self.capture = SqliteCapture(path, health=self.health)
        self.releaser = Releaser(path, self.health)  # deletes logged rows off the loop
        self.poll_interval_s = poll_interval_s
        self.max_entry_bytes = max_entry_bytes
        # Publications whose capture stopped on a row it cannot carry (kept until a
        # restart with a larger max_entry_bytes; their rows are kept in the source).
        self.refused: dict[str, RowTooLarge] = {}
        self.lock = threading.Lock()
        self.pubs: list[Publication] | None = None  # set when streaming starts
        self._streaming = threading.Event()
        self._entries = 0
        self.health.refused = self.refused
        self._unreleased = 0
        self._released_at = time.monotonic()
        self._defer_until: float | None = None  # a backlog's release waits till then

    @classmethod
    def open(cls, url: DatabaseUrl, options: SourceOptions) -> SqliteSource:
        return cls(
            url.sqlite_path,
            poll_interval_s=options.poll_interval_s,
            max_entry_bytes=options.max_entry_bytes,
        )

    @property
    def entries(self) -> int:
        return self._entries

    def slot_lag(self) -> None:
        return None  # no replication slot: triggers write the capture table

    def install(self, publication: str, incarnation: str, tables: Sequence[str]) -> list[str]:
        added = self.capture.install(publication, incarnation, [sqlite_table(t) for t in tables])
        return [format_table(None, t) for t in added]

    def release(self) -> None:
        self.releaser.close()
        self.capture.close()

    # -- streaming ---------------------------------------------------------------

    def stream(self, pubs: Sequence[Publication], halt: threading.Event) -> None:
        self.pubs = list(pubs)
        self._streaming.set()
        failures = 0
        force = True
        # wakes the loop on the source's writes (wake.py)
        watch = Watch(self.capture.path if self.watch else None)
        pace = Pace(watch, self.poll_interval_s)
        quiet = time.time()  # the last check that saw no commit: the poll stage's start
        try:
            while not halt.is_set():
                busy = False
                try:
                    checked = time.time()
                    if self.capture.changed() or force:
                        busy = True
                        with self.lock:
                            appended = self.step()
                        if appended and not force:
                            self._observe_poll(checked - max(quiet, pace.written_at))
                        # A poll that stopped where the origin changes left committed rows
                        # behind, which no later commit may come to announce: poll again.
                        force = self.cut
                    elif self._unreleased:
                        with self.lock:
                            self._release()
                    quiet = checked
                    failures = 0
                    self.health.ok()
                except Exception as e:  # keep capturing; the source may be busy or locked
                    failures += 1
                    self.health.failed(e)
                    force = True
                    log.error("capture failed; retrying", error=str(e), failures=failures)
                    halt.wait(RETRY.delay(failures))
                    continue
                while not force and not halt.is_set() and not pace.wait(halt, busy):
                    pass
        finally:
            watch.close()

    def _observe_poll(self, seconds: float) -> None:
        """The ``poll`` stage: the check that saw a commit, less the later of the last
        check that saw none and the last write to the source (the commit's own, unless
        another writer's came after it: an estimate, exact for a lone transaction)."""
        for p in self.pubs or ():
            if p.stages is not None:
                p.stages.observe(p.name, "poll", seconds)

    def step(self, upto: int | None = None) -> int:
        """One poll: committed capture rows (ids <= ``upto``) become one group per publication.

        Every row committed when the poll begins (ids <= P, the highest id handed
        out) is read in chunks of about ``max_entry_bytes``, each in its own short
        read transaction, and built into entries of at most ``max_entry_bytes``;
        a poll larger than one entry becomes a group of fragments
        (common/fragments.py).  Memory: one chunk plus one entry per publication.
        A publication whose rows cannot be carried (a row over the limit) stops
        with its error logged (:attr:`refused`); the others go on.
        """
        pubs = self.pubs
        if pubs is None:
            raise RuntimeError("capture is not running yet")
        live = [p for p in pubs if p.name not in self.refused]
        if not live:
            return 0
        if upto is None:
            cap = self.capture
            if cap.schema_version() != cap._schema_version:
                # DDL with no write after it: its 'S' row is written now, below the
                # bound read next (read() would write it above, seen at the next write)
                cap._waiting(cap.refresh)
            upto = cap.max_id()
        installed: dict[str, dict[str, int]] | None = None
        groups = {p.name: GroupWriter(p) for p in live}
        # the calls open in the poll's transactions (a poll reads whole ones: calls.py)
        scopes = {p.name: CallScope(p.config.procedures) for p in live}
        ends = {p.name: p.position for p in live}
        after = min(p.position for p in live)
        read = 0
        origin: str | None = None  # of the poll's rows: one per group (common/origin.py, R2)
        self.cut = False
        try:
            while True:
                rows = self.capture.read(after, upto, max_bytes=self.max_entry_bytes)
                if read == 0 and rows:
                    origin = rows[0].origin
                cut = next((i for i, r in enumerate(rows) if r.origin != origin), len(rows))
                if cut < len(rows):  # the origin changes: the poll ends here, the next goes on
                    del rows[cut:]
                    self.cut = True
                    upto = rows[-1].id if rows else after
                if not rows:
                    break
                read += len(rows)
                if installed is None:
                    installed = self.capture.installed()
                for pub in live:
                    if pub.name in self.refused:
                        continue
                    scope = scopes[pub.name]
                    self._build(pub, groups[pub.name], rows, ends, installed, origin, scope)
                after = rows[-1].id
                if after >= upto:  # nothing left to read below the bound: no empty read
                    break
            appended = sum(
                groups[p.name].finish(ends[p.name]) for p in live if p.name not in self.refused
            )
        except BaseException:
            for p in live:
                self.capture.forget(p.name)  # their schema ops may not have been logged
                if p.name not in self.refused:
                    groups[p.name].abort()
            raise
        if not read:
            return 0
        self._entries += appended
        # Deleting captured rows takes SQLite's write lock, which the application's
        # writers hold almost all the time under load: doing it every poll made
        # capture queue behind them (and grouped hundreds of transactions per entry).
        # Release at most once a second, or when many rows wait.
        self._unreleased += read
        if read >= RELEASE_ROWS and self._defer_until is None:
            self._defer_until = time.monotonic() + RELEASE_DEFER_S
        self._release()
        return appended

    def _build(
        self,
        pub: Publication,
        group: GroupWriter,
        rows: list[CapturedRow],
        ends: dict[str, int],
        installed: dict[str, dict[str, int]],
        origin: str | None,
        scope: CallScope,
    ) -> None:
        """Add ``pub``'s entries of one chunk to its group; refuse it on a row too large."""
        tables = installed.get(pub.name, {})
        try:
            entries, last = self.capture.build_framed(
                pub.name, _calls(scope, rows, ends[pub.name], tables), ends[pub.name], tables,
                self.max_entry_bytes,
            )  # fmt: skip
        except RowTooLarge as exc:
            self.refused[pub.name] = exc
            self.capture.forget(pub.name)
            group.abort()
            log.error("capture refused", publication=pub.name, table=exc.table, error=str(exc))
            return
        last = max(last, rows[-1].id)  # past the hidden rows and marks too
        now = int(time.time() * 1_000_000)
        for ops in entries:  # origin "": the source's own node (Publication.append)
            group.add(EncodedEntry(ops, now, origin or ""), last)
        ends[pub.name] = last

    def _release(self) -> None:
        """Release logged capture rows if a second has passed or many wait (release.py:
        deleted by a thread of its own, the loop goes on), unless a backlog was read
        less than :data:`RELEASE_DEFER_S` ago."""
        assert self.pubs is not None
        now = time.monotonic()
        if self._defer_until is not None:
            if now < self._defer_until:
                return
            self._defer_until = None
        if self._unreleased >= RELEASE_ROWS or now - self._released_at >= RELEASE_EVERY_S:
            self.releaser.request(min(p.position for p in self.pubs))
            self._unreleased = 0
            self._released_at = now

    # -- snapshots ---------------------------------------------------------------

    @contextmanager
    def snapshot(self, pub: Publication, *, timeout_s: float = 60.0) -> Iterator[Snapshot]:
        """Steps 1-4 of the module docstring; the rows are read in the pinned transaction."""
        # Consumed chunk by chunk from worker threads, one at a time: never concurrently.
        conn = sqlite3.connect(
            str(self.capture.path), isolation_level=None, timeout=30, check_same_thread=False
        )
        conn.text_factory = sqlite_text_factory  # TEXT that is not UTF-8 too
        try:
            seq, schemas, counts = self._pin(conn, pub, timeout_s)

            def chunks(schema: pb.TableSchema, chunk_rows: int) -> Iterator[pb.SnapshotChunk]:
                writers = [
                    stored_writer(c.type, c.scale) or value_writer(c.type, c.scale)
                    for c in schema.columns
                ]
                cols = ", ".join(qident(c.name) for c in schema.columns)
                table = qident(parse_table(schema.table).name)
                cur = conn.execute(f"SELECT {cols} FROM {table}")
                while True:
                    rows = cur.fetchmany(chunk_rows)
                    if not rows:
                        break
                    chunk = rows_chunk(schema.table)
                    add = chunk.rows.rows.add
                    for row in rows:
                        values = add().values
                        for write, v in zip(writers, row, strict=True):
                            write(values.add(), v)
                    yield chunk

            yield Snapshot(seq, [(s, counts[s.table]) for s in schemas], chunks)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    def _pin(
        self, conn: sqlite3.Connection, pub: Publication, timeout_s: float
    ) -> tuple[int, list[pb.TableSchema], dict[str, int]]:
        """Steps 1-3; leaves ``conn`` in the pinned read transaction."""
        if not self._streaming.wait(timeout_s):  # the capture thread may be starting
            raise RuntimeError("capture is not running yet")
        installed = self.capture.installed().get(pub.name, {})
        tables = [t for t in map(sqlite_table, pub.config.tables) if t in installed]
        with self.lock:
            conn.execute("BEGIN")
            position = self.capture.max_id(conn)  # the first read starts the snapshot
            self.step(upto=position)
            seq = pub.log.head
        # As the pinned transaction sees them: a later ALTER TABLE must not change
        # the columns read from it.
        schemas = [self.capture.read_schema(t, conn) for t in tables]
        count = "SELECT count(*) FROM {}"
        counts = {
            format_table(None, t): int(conn.execute(count.format(qident(t))).fetchone()[0])
            for t in tables
        }
        for s in schemas:  # entries and snapshots carry the wire's form (common/names.py)
            s.table = format_table(None, s.table)
        return seq, schemas, counts


def _calls(
    scope: CallScope, rows: list[CapturedRow], after: int, tables: dict[str, int]
) -> Iterator[CapturedRow]:
    """``rows`` as one publication sees them (publisher/capture/calls.py): the begin
    marks it records (``'C'``, made into call ops by ``build_entries``), no end marks,
    no row changes of a call it records.  Ready: the call came after the publication's
    last table was installed (its ``added_id``)."""
    ready_after = max(tables.values(), default=None)
    for r in rows:
        if r.id <= after:
            continue
        if r.op == "C":
            ready = ready_after is not None and r.id > ready_after
            if scope.begin(read_call(r.v), ready):
                yield r
        elif r.op == "E":
            scope.end()
        elif not (scope.hiding and r.pub is None and r.op in ("I", "U", "D")):
            yield r
