"""One segment file: recovery scan on open, and checked reads through a shared mmap.

The writer side (the active segment's file descriptor, group commit) lives in
``_log``; a :class:`Segment` only tracks what has been written and what is durable, and
serves reads of durable records.  See ``_framing`` for the byte layout.
"""

from __future__ import annotations

import mmap
import os
import threading
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

import structlog

from ._framing import (
    INDEX_INTERVAL,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_MAGIC,
    SEGMENT_HEADER_SIZE,
    TORN_INFIX,
    ZERO_BLOCK,
    decode_record_header,
    decode_segment_header,
    encode_segment_header,
    index_name,
    record_crc,
    segment_name,
)
from ._fsutil import atomic_write, fsync_dir, write_all
from ._index import load_index, save_index
from .errors import CorruptLogError

logger = structlog.get_logger(__name__)

_CRC_PREFIX = 16  # bytes of the record header covered by the CRC


class Segment:
    """A segment file: its first seq, sparse offsets, and written/durable extents.

    ``count``/``size`` describe what has been written; ``durable_count``/
    ``durable_size`` what readers may see.  Both only grow; the log's lock guards
    their updates, and readers take a consistent snapshot from the log.
    """

    __slots__ = (
        "_map_lock",
        "_mapped",
        "_mm",
        "count",
        "durable_count",
        "durable_size",
        "first_seq",
        "index_path",
        "offsets",
        "path",
        "size",
    )

    def __init__(
        self, directory: Path, first_seq: int, count: int, size: int, offsets: array[int]
    ) -> None:
        self.first_seq = first_seq
        self.path = directory / segment_name(first_seq)
        self.index_path = directory / index_name(first_seq)
        self.offsets = offsets
        self.count = count
        self.size = size
        self.durable_count = count
        self.durable_size = size
        self._mm: mmap.mmap | None = None
        self._mapped = 0
        self._map_lock = threading.Lock()

    @property
    def last_seq(self) -> int:
        """Seq of the last written record (first_seq - 1 when empty)."""
        return self.first_seq + self.count - 1

    @property
    def durable_last_seq(self) -> int:
        """Seq of the last durable record (first_seq - 1 when none)."""
        return self.first_seq + self.durable_count - 1

    def note_written(self, first_seq: int, base: int, starts: list[int], nbytes: int) -> None:
        """Record that records ``first_seq``.. were written at ``base + starts[i]``."""
        k = INDEX_INTERVAL
        rel = first_seq - self.first_seq
        # Only every k-th record goes into the sparse index.
        i = (-rel) % k
        n = len(starts)
        while i < n:
            self.offsets.append(base + starts[i])
            i += k
        self.count += n
        self.size += nbytes

    def save_index(self) -> None:
        """Write this (sealed) segment's index cache file."""
        save_index(self.index_path, self.first_seq, self.count, self.size, self.offsets)

    def _view(self, limit: int) -> mmap.mmap:
        mm = self._mm
        if mm is not None and self._mapped >= limit:
            return mm
        with self._map_lock:
            mm = self._mm
            if mm is not None and self._mapped >= limit:
                return mm
            fd = os.open(self.path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if size < limit:
                    raise CorruptLogError(
                        "segment is shorter than its durable size", self.path, size
                    )
                mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            # A reader still holding the previous map keeps it alive; GC unmaps it.
            self._mm = mm
            self._mapped = size
            return mm

    def release(self) -> None:
        """Drop the mapping (readers that hold it keep it alive until they finish)."""
        with self._map_lock:
            self._mm = None
            self._mapped = 0

    def read(
        self,
        seq: int,
        last_seq: int,
        limit: int,
        max_entries: int,
        max_bytes: int,
        out: list[bytes],
        total: int,
    ) -> int:
        """Append checked payloads of ``seq``..``last_seq`` to ``out``; return bytes so far.

        ``limit`` is the durable size of the segment in the caller's snapshot.  Stops at
        ``max_entries`` entries in ``out`` or before exceeding ``max_bytes`` of payload
        (but always returns at least one entry in ``out``).
        """
        mm = self._view(limit)
        path = self.path
        first = self.first_seq
        i = (seq - first) // INDEX_INTERVAL
        off = self.offsets[i]
        s = first + i * INDEX_INTERVAL
        unpack = RECORD_HEADER.unpack_from
        crc32 = zlib.crc32
        while s < seq:
            magic, length, rseq, _ = unpack(mm, off)
            if magic != RECORD_MAGIC or rseq != s:
                raise CorruptLogError(f"bad record header (expected seq {s})", path, off)
            off += RECORD_HEADER_SIZE + length
            s += 1
        while s <= last_seq and len(out) < max_entries:
            if off + RECORD_HEADER_SIZE > limit:
                raise CorruptLogError(f"record header of seq {s} past the end", path, off)
            magic, length, rseq, crc = unpack(mm, off)
            if out and total + length > max_bytes:
                break
            end = off + RECORD_HEADER_SIZE + length
            if magic != RECORD_MAGIC or rseq != s or end > limit:
                raise CorruptLogError(f"bad record header (expected seq {s})", path, off)
            payload = mm[off + RECORD_HEADER_SIZE : end]
            if crc32(payload, crc32(mm[off : off + _CRC_PREFIX])) != crc:
                raise CorruptLogError(f"CRC mismatch in record of seq {s}", path, off)
            out.append(payload)
            total += length
            off = end
            s += 1
        return total


def create_segment(directory: Path, first_seq: int) -> Segment:
    """Create an empty segment durably (tmp → fsync → rename → fsync dir)."""
    seg = Segment(directory, first_seq, 0, SEGMENT_HEADER_SIZE, array("Q"))
    atomic_write(seg.path, encode_segment_header(first_seq))
    return seg


@dataclass(frozen=True, slots=True)
class _Scan:
    count: int
    end: int  # offset just past the last valid record
    offsets: array[int]
    reason: str  # why the scan stopped before the end of the file ("" if it did not)


def _scan(buf: mmap.mmap | bytes, first_seq: int, start: int, size: int) -> _Scan:
    """Walk records from ``start``, checking every header, seq and CRC."""
    offsets: array[int] = array("Q")
    off = start
    count = 0
    unpack = RECORD_HEADER.unpack_from
    crc32 = zlib.crc32
    reason = ""
    while off < size:
        if off + RECORD_HEADER_SIZE > size:
            reason = "short record header"
            break
        magic, length, rseq, crc = unpack(buf, off)
        if magic != RECORD_MAGIC:
            reason = "bad record magic"
            break
        end = off + RECORD_HEADER_SIZE + length
        if end > size:
            reason = f"record length {length} runs past the end of the file"
            break
        seq = first_seq + count
        if rseq != seq:
            reason = f"record seq {rseq} where {seq} was expected"
            break
        if crc32(buf[off + RECORD_HEADER_SIZE : end], crc32(buf[off : off + _CRC_PREFIX])) != crc:
            reason = f"CRC mismatch in record of seq {seq}"
            break
        if count % INDEX_INTERVAL == 0:
            offsets.append(off)
        count += 1
        off = end
    return _Scan(count, off, offsets, reason)


def _valid_record_after(buf: mmap.mmap | bytes, start: int, size: int) -> int | None:
    """Offset of the first whole, CRC-valid record starting after ``start``, if any."""
    pos = buf.find(RECORD_MAGIC, start + 1)
    while pos != -1:
        hdr = decode_record_header(buf, pos)
        if hdr is not None:
            end = pos + RECORD_HEADER_SIZE + hdr.length
            if end <= size:
                prefix = bytes(buf[pos : pos + _CRC_PREFIX])
                if record_crc(prefix, bytes(buf[pos + RECORD_HEADER_SIZE : end])) == hdr.crc:
                    return pos
        pos = buf.find(RECORD_MAGIC, pos + 1)
    return None


def _zero_block(buf: mmap.mmap | bytes, start: int, end: int) -> bool:
    """Whether a ZERO_BLOCK-aligned block between ``start`` and ``end`` is all zeros: a
    page of a crashed round that never reached the preallocated space (_framing)."""
    off = -(-start // ZERO_BLOCK) * ZERO_BLOCK
    zero = bytes(ZERO_BLOCK)
    while off + ZERO_BLOCK <= end:
        if buf[off : off + ZERO_BLOCK] == zero:
            return True
        off += ZERO_BLOCK
    return False


def _save_torn_tail(path: Path, data: bytes, start: int) -> Path:
    """Copy the torn bytes aside as ``<segment>.torn-<start>`` (never overwriting one)."""
    aside = path.with_name(f"{path.name}{TORN_INFIX}{start}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}{TORN_INFIX}{start}.{n}")
        n += 1
    atomic_write(aside, data)
    return aside


def recover_segment(directory: Path, first_seq: int, *, last: bool, trust_index: bool) -> Segment:
    """Open an existing segment, verify it, and cut a torn tail if it is the last one.

    Raises CorruptLogError (file and offset) for damage recovery must not paper over.
    With ``trust_index`` a sealed segment whose index cache is valid is checked only at
    its header and its last index interval instead of record by record.
    """
    path = directory / segment_name(first_seq)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise CorruptLogError(f"cannot open segment: {exc.strerror}", path, 0) from exc
    try:
        size = os.fstat(fd).st_size
        header = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
        if decode_segment_header(header) != first_seq:
            raise CorruptLogError("bad segment header or first seq differs from name", path, 0)
        if size == SEGMENT_HEADER_SIZE:
            return Segment(directory, first_seq, 0, size, array("Q"))
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise CorruptLogError(f"cannot read segment: {exc.strerror}", path, 0) from exc
    finally:
        os.close(fd)
    try:
        if trust_index and not last:
            seg = _from_index(directory, first_seq, path, mm, size)
            if seg is not None:
                return seg
        scan = _scan(mm, first_seq, SEGMENT_HEADER_SIZE, size)
        if scan.end == size:
            return Segment(directory, first_seq, scan.count, size, scan.offsets)
        if not last:
            raise CorruptLogError(scan.reason + " in a sealed segment", path, scan.end)
        # Where the trailing zeros begin: preallocated space (_framing) ends the file.
        zeros_from = scan.end + len(mm[scan.end : size].rstrip(b"\0"))
        torn = b""
        if zeros_from > scan.end:
            later = _valid_record_after(mm, scan.end, size)
            if later is not None and not _zero_block(mm, scan.end, later):
                raise CorruptLogError(
                    f"{scan.reason}, followed by a valid record at offset {later}", path, scan.end
                )
            torn = bytes(mm[scan.end : zeros_from])
    finally:
        mm.close()
    aside = _save_torn_tail(path, torn, scan.end) if torn else None
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, scan.end)
        os.fsync(fd)
    finally:
        os.close(fd)
    if aside is None:  # nothing but preallocated zeros after the last record
        logger.info("log preallocated space trimmed", segment=str(path), start=scan.end, end=size)
        return Segment(directory, first_seq, scan.count, scan.end, scan.offsets)
    fsync_dir(directory)
    logger.warning(
        "log torn tail truncated",
        segment=str(path),
        start=scan.end,
        end=size,
        nbytes=size - scan.end,
        reason=scan.reason,
        saved_to=str(aside),
    )
    return Segment(directory, first_seq, scan.count, scan.end, scan.offsets)


def _from_index(
    directory: Path, first_seq: int, path: Path, mm: mmap.mmap, size: int
) -> Segment | None:
    """Use the index cache of a sealed segment if it is valid; None to fall back to a scan."""
    loaded = load_index(directory / index_name(first_seq), first_seq, size)
    if loaded is None:
        return None
    count, offsets = loaded
    if count == 0 or not offsets:
        return None
    # Check the tail interval record by record: it must end exactly at the file's end.
    last_start = offsets[-1]
    k = len(offsets) - 1
    tail = _scan(mm, first_seq + k * INDEX_INTERVAL, last_start, size)
    if tail.end != size or k * INDEX_INTERVAL + tail.count != count:
        return None
    return Segment(directory, first_seq, count, size, offsets)


def write_tail(fd: int, data: bytes) -> None:
    """Append framed records to the active segment's descriptor."""
    write_all(fd, data)
