"""The entries appended last, kept in memory for the reads of in-sync feeds (issue 23).

An in-sync feed reads each entry right after it became durable: one entry from the
end of the active segment.  Through the segment's mmap that read cost a new mapping
each time (the file had grown: open, fstat, mmap, close, and the old mapping's
munmap), the walk from the sparse index to the record, and the record's CRC; about
7 % of the publisher's Python time at 1,000 transactions/s.  The log now keeps the
payloads of its last appends (the very bytes objects the appenders passed, so
keeping them costs no copy) and serves a read that starts among them from memory.

What a read returns is unchanged: the payloads of consecutive seqs from the one
asked, never past the head (durable), with the same ``max_entries`` /
``max_bytes`` rule.  Only where they come from differs.  A record read back from
the file is checked (magic, seq, CRC) because the disk or the page cache may have
damaged it; these bytes never went through either.  Damage on disk is still found
by every read that goes to the file (a subscriber catching up, a restart) and by
recovery.

Bounds: ``max_bytes`` (1 MiB) and ``max_entries`` (4,096) per log, oldest dropped
first; an entry larger than the budget is not kept.  A reader further behind reads
the file, as before.

Rejected: reading the tail past the mapped part with ``pread`` on a kept file
descriptor (still a system call, a copy and a CRC per read, and an fd per segment to
close safely under concurrent readers); mapping the file past its end (Python's
mmap refuses a length beyond the file's size).

Not thread-safe: the log calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RECENT_BYTES", "RECENT_ENTRIES", "Recent"]

RECENT_BYTES = 1 << 20
RECENT_ENTRIES = 4096


class Recent:
    """Payloads of seqs ``first .. first + len - 1``, the last appended."""

    __slots__ = ("_bytes", "_entries", "_start", "first", "max_bytes", "max_entries")

    def __init__(
        self, next_seq: int, *, max_bytes: int = RECENT_BYTES, max_entries: int = RECENT_ENTRIES
    ) -> None:
        self.first = next_seq  # the seq of _entries[_start]
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: list[bytes] = []
        self._start = 0  # entries before it were dropped (compacted now and then)
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries) - self._start

    def add(self, first_seq: int, payloads: Sequence[bytes]) -> None:
        """Keep the payloads just appended as ``first_seq``, ``first_seq + 1``, ..."""
        entries = self._entries
        if first_seq != self.first + len(self):  # not contiguous: start afresh
            entries.clear()
            self._start = self._bytes = 0
            self.first = first_seq
        for p in payloads:
            entries.append(p if type(p) is bytes else bytes(p))
            self._bytes += len(p)
        start = self._start
        while start < len(entries) and (
            self._bytes > self.max_bytes or len(entries) - start > self.max_entries
        ):
            self._bytes -= len(entries[start])
            entries[start] = b""  # dropped: its payload is freed now, not at compaction
            start += 1
        self.first += start - self._start
        if start > 1024 and start * 2 > len(entries):
            del entries[:start]
            start = 0
        self._start = start

    def read(self, seq: int, head: int, max_entries: int, max_bytes: int) -> list[bytes] | None:
        """The payloads from ``seq`` (at most to ``head``) as :meth:`Log.read` returns
        them, or None when ``seq`` is not kept here."""
        i = seq - self.first
        n = len(self)
        if i < 0 or i >= n or seq > head:
            return None
        j = self._start + i
        last = self._start + min(n, head - self.first + 1, i + max_entries)
        if last - j == 1:
            return [self._entries[j]]
        out: list[bytes] = []
        total = 0
        for p in self._entries[j:last]:
            if out and total + len(p) > max_bytes:
                break
            out.append(p)
            total += len(p)
        return out
