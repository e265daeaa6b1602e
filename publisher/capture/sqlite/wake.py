"""Waking SQLite capture when the source is written, instead of sleeping a poll interval.

SQLite has no cross-process notification; the capture loop learns of another
connection's commit from ``PRAGMA data_version`` (``SqliteCapture.changed``).  Until
issue 23 it checked that every ``poll_interval_ms`` and nothing else, so a commit
waited half an interval on average.  Here the loop also watches the source's
directory with Linux inotify and checks at once when one of the source's files is
written.  The watch is a *hint*, never the proof of a commit: the proof stays
``data_version``, and the poll stays as the fallback.

The ordering argument (why a hint, and how long to keep looking after one)
-------------------------------------------------------------------------
A commit in WAL mode (1) ``write()``s its frames to ``<db>-wal`` (an
``IN_MODIFY`` event), (2) fsyncs it under ``synchronous = FULL``, (3) publishes the
commit by storing the new wal-index header in the mmapped ``<db>-shm`` (a memory
store: no event), (4) releases its locks.  In rollback-journal mode it writes the
journal, then the database pages (``IN_MODIFY`` on ``<db>``), and commits by
deleting, truncating or zeroing the journal (``IN_DELETE`` / ``IN_MODIFY``), then
unlocks.  So the last event of a commit comes *before* the commit is visible, by
an fsync at most (WAL) or a few microseconds (the rest): a check right at the
event may still read the old ``data_version``, and no later event is due.  Hence
the schedule after an event (:meth:`Pace.wait`, idle): check at once, then every
:data:`HOT_STEP_S` until :data:`HOT_S` has passed since the last event, then wait
as long again as has passed since it (the checks double apart) up to the
fallback ``poll_interval``.  A commit that becomes visible ``d`` after its last
write is seen within :data:`HOT_STEP_S` of that when ``d`` < :data:`HOT_S`, within
``d`` more otherwise, and never later than the fallback poll: the watch only ever
shortens the wait, it cannot lose a change.

Busy and idle.  The events only pace an *idle* capture (its last check found no
commit).  While commits keep coming (the last check found one), the loop checks
every :data:`BUSY_STEP_S` (at most ``poll_interval``) and reads the events only
once idle again: a commit writes several pages, an event each, and waking for each
one in the W1 bench (1,000 transactions a second, every commit its own step, the
GIL handed back and forth with the feed's threads at each wake-up) made the
end-to-end lag 2.5-13x worse than polling on a loaded machine (docs/performance.md).
Under load a step groups the commits of its time, as the polling capture did;
the first commit after a quiet spell is taken at once.

Rejected: watching ``<db>-wal`` alone (the file is deleted when the last
connection closes and re-created; the directory's watch survives that); waiting
on the write lock to learn the commit's end (it would take the source's write
lock, or sleep in SQLite's busy handler); a hook in the application (SQLite's
``update_hook`` is per connection, in the writer's process); a tight
``data_version`` loop (a check costs little, the wake-ups do not: see
docs/performance.md for the CPU figures).  Where inotify is missing (not Linux,
a refused watch) :class:`Watch` is inactive and the loop polls as before.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import sys
import threading
import time
from pathlib import Path

import structlog

__all__ = ["BUSY_STEP_S", "HALT_CHECK_S", "HOT_S", "HOT_STEP_S", "Pace", "Watch"]

log = structlog.get_logger(__name__)

BUSY_STEP_S = 0.002  # checks this far apart while commits keep coming
HOT_STEP_S = 0.0005  # checks this far apart right after a write to the source
HOT_S = 0.02  # for this long after the last write (an fsync on a loaded disk)
HALT_CHECK_S = 0.1  # the longest single wait: how soon a halt is noticed

_IN_MODIFY = 0x002
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_Q_OVERFLOW = 0x4000
_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class Watch:
    """An inotify watch on the directory of a SQLite file, for that file's writes."""

    def __init__(self, path: Path | None) -> None:
        """``path`` None: an inactive watch (capture polls)."""
        self.fd = -1
        self._names: set[bytes] = set()
        if path is None:
            return
        real = path.resolve()  # a symlink's events name the file it points to
        self._names = {os.fsencode(real.name + s) for s in ("", "-wal", "-journal")}
        if not sys.platform.startswith("linux"):
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = int(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
        except (OSError, AttributeError):
            fd = -1
        if fd < 0:
            log.warning("cannot watch the SQLite source; capture polls", path=str(path))
            return
        directory = os.fsencode(real.parent)
        if int(libc.inotify_add_watch(fd, directory, _MASK)) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            log.warning(
                "cannot watch the SQLite source; capture polls",
                path=str(path),
                error=os.strerror(err),
            )
            return
        self.fd = fd

    @property
    def active(self) -> bool:
        return self.fd >= 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s``; True when one of the source's files was written."""
        if self.fd < 0:
            time.sleep(timeout_s)
            return False
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        return bool(ready) and self._drain()

    def _drain(self) -> bool:
        """Read every queued event; True if one names the source's files (or overflowed)."""
        hit = False
        while True:
            try:
                buf = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return hit
            at = 0
            while at + _EVENT.size <= len(buf):
                _wd, mask, _cookie, size = _EVENT.unpack_from(buf, at)
                name = buf[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                if mask & _IN_Q_OVERFLOW or name in self._names:
                    hit = True


class Pace:
    """When the capture loop checks ``data_version`` next (the module docstring).

    Busy (the last check found a commit): the next check comes :data:`BUSY_STEP_S`
    after the last one began (at most ``poll_s``), whatever is written meanwhile:
    the commits of that time make one step, as with polling.  Idle (it found none):
    a write event makes the check due at once; after each check the next is set :data:`HOT_STEP_S`
    later while less than :data:`HOT_S` has passed since the last event, else as
    long after as has passed since it, never more than ``poll_s`` (the fallback).
    Without a watch: every ``poll_s``.
    """

    def __init__(self, watch: Watch, poll_s: float) -> None:
        self.watch = watch
        self.poll_s = poll_s
        self._written = -1e9  # monotonic time of the last write event
        self.written_at = 0.0  # its wall-clock time (the ``poll`` stage's start)
        self._next = time.monotonic()  # of the next check, when idle
        self._checked = self._next  # when the last check began (the busy step's start)

    def wait(self, halt: threading.Event, busy: bool) -> bool:
        """Wait; True: check now.  False: not due yet, woke to let the caller see ``halt``.

        ``busy``: the last check found a commit.
        """
        if not self.watch.active:
            halt.wait(self.poll_s)
            return True
        if busy:
            # Under load a wake-up per write event (several per commit) cost the
            # daemon's other threads the GIL as often and made every stage slower
            # (docs/performance.md): pace like the polling capture while commits come.
            # The events of these writes stay queued: the first idle wait reads them.
            # The step is counted from the last check's start: the check's own work
            # (read, build, the log's fsync) is part of it, not added to it.
            step = min(BUSY_STEP_S, self.poll_s)
            halt.wait(max(0.0, self._checked + step - time.monotonic()))
            self._checked = time.monotonic()
            return True
        timeout = min(max(0.0, self._next - time.monotonic()), HALT_CHECK_S)
        written = self.watch.wait(timeout)
        now = time.monotonic()
        if written:
            self._written, self.written_at = now, time.time()
        elif now < self._next:
            return False
        since = now - self._written
        self._next = now + min(HOT_STEP_S if since < HOT_S else since, self.poll_s)
        self._checked = now
        return True
