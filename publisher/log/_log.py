"""The Log: group-committed appends, reads, listeners, retention, close.

Opening a directory (locking it, recovering its segments, creating a new log)
is in ``_open.py``; it hands the recovered segments to :class:`Log`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import structlog

from ._framing import (
    PREALLOC_BYTES,
    PREALLOC_ROUND,
    encode_records,
)
from ._fsutil import fsync_dir, pwrite_all
from ._recent import Recent
from ._segment import Segment, create_segment
from ._watch import HeadWatch
from .errors import (
    CorruptLogError,
    LogClosedError,
    LogError,
    LogFailedError,
    PurgedError,
)

logger = structlog.get_logger(__name__)

FsyncPolicy = Literal["always", "interval"]
Listener = Callable[[int], None]


class Log:
    """A per-publication, append-only, segmented log of opaque entries.

    Thread-safe.  One lock guards the writer state (active segment, seq counters) and
    the list of segments; fsync runs outside it, so appenders that arrive while an
    fsync is running write their records and then share the next fsync (group commit).
    Readers take a snapshot under the lock and read through per-segment mmaps, or
    from memory when they read the last entries appended (``_recent.py``).

    Use :func:`open_log` to get one.
    """

    def __init__(
        self,
        directory: Path,
        *,
        incarnation: str,
        segments: list[Segment],
        lock_fd: int,
        fsync: FsyncPolicy,
        fsync_interval_ms: int,
        segment_bytes: int,
    ) -> None:
        self.directory = directory
        self.incarnation = incarnation
        self._fsync_policy: FsyncPolicy = fsync
        self._fsync_interval = fsync_interval_ms / 1000.0
        self._segment_bytes = segment_bytes
        self._lock_fd = lock_fd
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Copy-on-write: replaced (never mutated) when segments are added or purged.
        self._segments: tuple[Segment, ...] = tuple(segments)
        self._firsts: tuple[int, ...] = tuple(s.first_seq for s in segments)
        active = segments[-1]
        self._active = active
        # Written at offsets (pwrite), not O_APPEND: zeros may follow the last record
        # (_framing, "Preallocated space"); _file_end is the file's size.
        self._fd = os.open(active.path, os.O_WRONLY)
        self._file_end = os.fstat(self._fd).st_size
        self._written = active.last_seq
        self._head = active.last_seq
        self._recent = Recent(active.last_seq + 1)  # the last payloads appended
        # One head watch per event loop that waits on this log (_watch.py).
        self._watches: dict[asyncio.AbstractEventLoop, HeadWatch] = {}
        self._syncing = False
        # Framed records appended under "always" and not yet written (see append()).
        self._pending: list[bytes] = []
        # Group commit: appenders wait on the condition of the round carrying their
        # records, so a round's end wakes only them (plus one to lead the next round).
        self._inflight = threading.Condition(self._lock)
        self._inflight_target = 0
        self._next_round = threading.Condition(self._lock)
        self._failed: BaseException | None = None
        self._closed = False
        self._closing = False
        self._listeners: tuple[Listener, ...] = ()
        #: Called with the fd just before each data fsync (tests count group commits).
        self.fsync_hook: Callable[[int], None] | None = None
        self._flusher: threading.Thread | None = None
        self._stop_flusher = threading.Event()
        if fsync == "interval":
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"log-flush-{directory.name}", daemon=True
            )
            self._flusher.start()

    # -- state ----------------------------------------------------------------

    @property
    def head(self) -> int:
        """The last durable seq; 0 when nothing was ever appended."""
        return self._head

    @property
    def first_seq(self) -> int:
        """The lowest retained seq; ``head + 1`` when the log holds no entry."""
        with self._lock:
            return self._first_seq_locked()

    def _first_seq_locked(self) -> int:
        first = self._segments[0].first_seq
        return first if first <= self._head else self._head + 1

    @property
    def size_bytes(self) -> int:
        """Bytes of segment files (including data written but not yet durable)."""
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __repr__(self) -> str:
        return f"<Log {self.directory} head={self._head} incarnation={self.incarnation}>"

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- append ---------------------------------------------------------------

    def append(self, payloads: Sequence[bytes], *, wait: bool = True) -> int:
        """Append entries; return the seq of the first one (the rest follow consecutively).

        Under ``fsync="always"`` returns once the entries are durable (fsynced, shared
        with concurrent appenders).  Under ``"interval"`` returns once they are written
        to the OS; they become durable, and visible to readers and listeners, at the
        next periodic fsync (see :meth:`flush`).

        ``wait=False`` (``"always"`` only): return at once; the entries are queued for
        the next fsync round and become durable and visible at the next :meth:`flush`
        by anyone.  For an appender that makes its own durability points (PostgreSQL
        capture flushes before it confirms a position to the source).
        """
        if not payloads:
            raise ValueError("append needs at least one entry")
        with self._lock:
            self._check_writable()
            if self._active.size >= self._segment_bytes and self._active.count > 0:
                self._roll_locked()
            seg = self._active
            first = self._written + 1
            data, starts = encode_records(first, payloads)
            base = seg.size
            if self._fsync_policy == "always":
                # Queued for the next sync leader, which writes all queued records with
                # one write() before its fsync: no syscall while holding the lock.
                self._pending.append(data)
            else:
                try:
                    self._write_at(self._fd, base, data)
                except OSError as exc:
                    self._fail_locked(exc)
                    raise LogFailedError(f"write failed: {exc}", seg.path, base) from exc
            seg.note_written(first, base, starts, len(data))
            self._recent.add(first, payloads)
            self._written = last = first + len(payloads) - 1
            if self._fsync_policy == "always" and wait:
                self._wait_durable_locked(last)
        return first

    def flush(self) -> int:
        """Make everything appended so far durable now; return the head."""
        with self._lock:
            self._check_writable()
            self._wait_durable_locked(self._written)
            return self._head

    def _wait_durable_locked(self, seq: int) -> None:
        """Block (holding the lock on entry and exit) until ``seq`` is durable.

        The first waiter to find no fsync running becomes the leader: it fsyncs
        everything written so far, outside the lock, then publishes the new head.
        Others wait; those whose records were written during the leader's fsync are
        covered by the next leader.
        """
        while self._head < seq:
            if self._failed is not None:
                raise LogFailedError("an earlier write or fsync failed", self.directory)
            if self._closed:
                raise LogClosedError("log closed while appending", self.directory)
            if self._syncing:
                # Wake only when the round carrying our records completes (or, for
                # records queued after the leader took its batch, to lead the next).
                if seq <= self._inflight_target:
                    self._inflight.wait()
                else:
                    self._next_round.wait()
                continue
            self._sync_round_locked()

    def _sync_round_locked(self) -> None:
        """Run one fsync as the leader (lock held on entry and exit)."""
        self._syncing = True
        inflight = self._inflight
        try:
            seg = self._active
            fd = self._fd
            target = self._written
            target_size = seg.size
            target_count = seg.count
            pending = self._pending
            self._pending = []
            # The two conditions take turns (no new Condition per round; issue 23, CPU
            # per entry): the last round's was notified, all its waiters, at that
            # round's end, and nobody waited on it since (they wait on it only while a
            # round runs), so it serves the waiters of the round after this one.
            inflight, self._next_round = self._next_round, self._inflight
            self._inflight = inflight
            self._inflight_target = target
            error: OSError | None = None
            self._lock.release()
            try:
                if pending:
                    data = pending[0] if len(pending) == 1 else b"".join(pending)
                    self._write_at(fd, target_size - len(data), data)
                hook = self.fsync_hook
                if hook is not None:
                    hook(fd)
                os.fdatasync(fd)
            except OSError as exc:
                error = exc
            finally:
                self._lock.acquire()
            if error is not None:
                self._fail_locked(error)
                raise LogFailedError(f"write or fsync failed: {error}", seg.path) from error
            if target > self._head:
                seg.durable_count = max(seg.durable_count, target_count)
                seg.durable_size = max(seg.durable_size, target_size)
                self._head = target
                listeners = self._listeners
                if listeners:
                    # Notify outside the lock but still as the leader, so listeners see
                    # heads in increasing order.
                    self._lock.release()
                    try:
                        self._notify(listeners, target)
                    finally:
                        self._lock.acquire()
        finally:
            self._syncing = False
            inflight.notify_all()
            self._next_round.notify(1)  # one of the next round's waiters leads it
            self._cond.notify_all()

    def _write_at(self, fd: int, offset: int, data: bytes) -> None:
        """Write records at ``offset``; a small write past the file's end also writes
        zeros ahead (_framing, "Preallocated space").  Only the round's leader (or,
        under "interval", the appender holding the lock) calls it."""
        pwrite_all(fd, data, offset)
        end = offset + len(data)
        if end > self._file_end:
            self._file_end = end
            if len(data) < PREALLOC_ROUND:
                try:
                    pwrite_all(fd, bytes(PREALLOC_BYTES), end)
                except OSError:  # a full disk: the records are written, the zeros optional
                    return
                self._file_end = end + PREALLOC_BYTES

    def _trim_locked(self, fd: int, seg: Segment) -> None:
        """Cut the zeros after ``seg``'s last record (all durable), durably.  The file's
        own size decides (a zero-fill a full disk cut short is not in ``_file_end``)."""
        if os.fstat(fd).st_size > seg.size:
            os.ftruncate(fd, seg.size)
            os.fdatasync(fd)
            self._file_end = seg.size

    @staticmethod
    def _notify(listeners: tuple[Listener, ...], head: int) -> None:
        for cb in listeners:
            try:
                cb(head)
            except Exception:
                logger.exception("log listener failed", head=head)

    def _roll_locked(self) -> None:
        """Seal the active segment (durably, with its index) and start the next one.

        Called with the lock held when the active segment is full.  Loops until no
        fsync runs and nothing is pending, because the lock is released while waiting
        or syncing and another appender may roll, or queue records, meanwhile.
        """
        while True:
            self._check_writable()
            if self._active.size < self._segment_bytes or self._active.count == 0:
                return  # another appender rolled while we waited
            if self._syncing:
                self._cond.wait()
            elif self._head < self._written:
                self._sync_round_locked()
            else:
                break
        old = self._active
        try:
            self._trim_locked(self._fd, old)  # a sealed segment holds no zeros
            os.close(self._fd)
            self._fd = -1
            try:
                old.save_index()
            except OSError as exc:  # the index is a cache: losing it costs a scan
                logger.warning("log index not written", path=str(old.index_path), error=str(exc))
            new = create_segment(self.directory, old.last_seq + 1)
            self._fd = os.open(new.path, os.O_WRONLY)
            self._file_end = new.size
        except OSError as exc:
            self._fail_locked(exc)
            raise LogFailedError(f"cannot start a new segment: {exc}", self.directory) from exc
        self._active = new
        self._segments = (*self._segments, new)
        self._firsts = (*self._firsts, new.first_seq)

    def _fail_locked(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            logger.error(
                "log failed; reopen required", directory=str(self.directory), error=str(exc)
            )
        self._inflight.notify_all()
        self._next_round.notify_all()
        self._cond.notify_all()

    def _check_writable(self) -> None:
        if self._closed or self._closing:
            raise LogClosedError("log is closed", self.directory)
        if self._failed is not None:
            raise LogFailedError(f"log failed earlier: {self._failed}", self.directory)

    def _flush_loop(self) -> None:
        while not self._stop_flusher.wait(self._fsync_interval):
            with self._lock:
                if self._closed or self._failed is not None:
                    return
                if self._head < self._written and not self._syncing:
                    try:
                        self._sync_round_locked()
                    except LogError:
                        return

    # -- read -----------------------------------------------------------------

    def read(
        self, from_seq: int, *, max_entries: int = 1000, max_bytes: int = 4 << 20
    ) -> list[bytes]:
        """Return the stored payloads of consecutive entries from ``from_seq``.

        At least one entry when ``from_seq <= head`` (even one larger than
        ``max_bytes``); ``[]`` when ``from_seq > head``.  Raises PurgedError below
        ``first_seq`` and CorruptLogError rather than return a damaged entry.
        """
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        with self._lock:
            if self._closed:
                raise LogClosedError("log is closed", self.directory)
            head = self._head
            if from_seq > head:
                return []
            first_seq = self._first_seq_locked()
            if from_seq < first_seq:
                raise PurgedError(self.directory, from_seq, first_seq)
            recent = self._recent.read(from_seq, head, max_entries, max_bytes)
            if recent is not None:
                return recent
            segments = self._segments
            firsts = self._firsts
            # Durable extents of the active segment, consistent with head.
            extents = [(s.durable_last_seq, s.durable_size) for s in segments]
        out: list[bytes] = []
        total = 0
        i = bisect_right(firsts, from_seq) - 1
        seq = from_seq
        while i < len(segments) and seq <= head and len(out) < max_entries:
            last, limit = extents[i]
            if seq <= last:
                try:
                    total = segments[i].read(
                        seq, min(last, head), limit, max_entries, max_bytes, out, total
                    )
                except (OSError, ValueError) as exc:
                    raise CorruptLogError(f"cannot read segment: {exc}", segments[i].path) from exc
                seq = from_seq + len(out)
                if seq <= last:  # stopped by a limit inside this segment
                    break
            i += 1
        return out

    # -- listeners ------------------------------------------------------------

    def add_listener(self, cb: Listener) -> Callable[[], None]:
        """Call ``cb(new_head)`` after each durable append (on the appending thread).

        Returns a function that removes the listener.  Callbacks must be quick and
        must not append to this log.
        """
        with self._lock:
            self._listeners = (*self._listeners, cb)

        def unsubscribe() -> None:
            with self._lock:
                ls = list(self._listeners)
                for j, other in enumerate(ls):
                    if other is cb:
                        del ls[j]
                        break
                self._listeners = tuple(ls)

        return unsubscribe

    def watch(self) -> HeadWatch:
        """The head watch of the running event loop (made and registered as a listener
        on first use; the watches of closed loops are dropped then)."""
        loop = asyncio.get_running_loop()
        watch = self._watches.get(loop)
        if watch is None:
            with self._lock:
                for old in [w for w in self._watches.values() if w.loop.is_closed()]:
                    del self._watches[old.loop]
                    self._listeners = tuple(cb for cb in self._listeners if cb != old.on_head)
                watch = self._watches[loop] = HeadWatch(lambda: self._head, loop)
                self._listeners = (*self._listeners, watch.on_head)
        return watch

    # The timeout parameter is part of the public API the feed codes against.
    async def wait_for(self, seq: int, timeout: float | None = None) -> int:  # noqa: ASYNC109
        """Return the head once it reaches ``seq``, or the current head after ``timeout``."""
        head = self._head
        if head >= seq:
            return head
        watch = self.watch()
        fut = watch.future(seq)
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            return self._head
        finally:
            watch.discard(fut)

    # -- retention ------------------------------------------------------------

    def purge(self, up_to_seq: int) -> int:
        """Delete whole segments whose entries are all ``<= up_to_seq``.

        Never deletes the segment holding the head, nor the active segment.  Returns
        the number of entries removed.
        """
        with self._lock:
            self._check_open()
            n = 0
            while self._can_drop_first_locked() and self._segments[1].first_seq - 1 <= up_to_seq:
                n += self._drop_first_locked()
        if n:
            fsync_dir(self.directory)
        return n

    def enforce_limits(self, max_bytes: int | None, max_age_s: float | None) -> int:
        """Purge oldest whole segments beyond a total size or age; return the new first_seq.

        A segment's age is the time since its last write (its mtime).  Entries removed
        here may still be needed by subscribers: the caller must invalidate them.
        """
        removed_from: int | None = None
        removed_to = 0
        with self._lock:
            self._check_open()
            now = time.time()
            while self._can_drop_first_locked():
                seg = self._segments[0]
                over_size = (
                    max_bytes is not None and sum(s.size for s in self._segments) > max_bytes
                )
                over_age = False
                if max_age_s is not None:
                    try:
                        over_age = now - seg.path.stat().st_mtime > max_age_s
                    except OSError:
                        over_age = False
                if not (over_size or over_age):
                    break
                if removed_from is None:
                    removed_from = seg.first_seq
                removed_to = seg.last_seq
                self._drop_first_locked()
            first = self._first_seq_locked()
        if removed_from is not None:
            fsync_dir(self.directory)
            logger.warning(
                "log retention limit purged entries",
                directory=str(self.directory),
                first_removed=removed_from,
                last_removed=removed_to,
                max_bytes=max_bytes,
                max_age_s=max_age_s,
            )
        return first

    def _can_drop_first_locked(self) -> bool:
        segs = self._segments
        if len(segs) < 2:
            return False
        first = segs[0]
        # Never the segment holding head (possible when the active segment is empty).
        return first.durable_last_seq < self._head and first.count == first.durable_count

    def _drop_first_locked(self) -> int:
        seg = self._segments[0]
        # Oldest first, so a crash part-way leaves a contiguous log.
        seg.path.unlink(missing_ok=True)
        seg.index_path.unlink(missing_ok=True)
        seg.release()
        self._segments = self._segments[1:]
        self._firsts = self._firsts[1:]
        return seg.count

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("log is closed", self.directory)

    # -- close ----------------------------------------------------------------

    def close(self) -> None:
        """Flush (best effort), write the active segment's index, and release the log."""
        with self._lock:
            if self._closed or self._closing:
                return
            self._closing = True  # refuse new appends while the last ones are flushed
            while self._failed is None and (self._syncing or self._head < self._written):
                if self._syncing:
                    self._cond.wait()
                    continue
                try:
                    self._sync_round_locked()
                except LogError:
                    break
            self._closed = True
            self._stop_flusher.set()
            self._inflight.notify_all()
            self._next_round.notify_all()
            self._cond.notify_all()
            fd, self._fd = self._fd, -1
            segments = self._segments
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
        if fd >= 0:
            if self._failed is None:
                try:  # a log closed cleanly holds no zeros (older code reads it as is)
                    self._trim_locked(fd, segments[-1])
                except OSError as exc:  # the zeros are trimmed at the next open instead
                    logger.warning("log preallocated space not trimmed", error=str(exc))
            os.close(fd)
        if self._failed is None:
            active = segments[-1]
            if active.count:
                try:
                    active.save_index()
                except OSError:
                    pass
        for seg in segments:
            seg.release()
        os.close(self._lock_fd)


__all__ = ["FsyncPolicy", "Listener", "Log"]
