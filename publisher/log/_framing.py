"""On-disk format of a publication log, byte by byte.

Everything below is the contract; the code in this package follows it.  All integers
are unsigned and big-endian.  "CRC" is CRC-32 (IEEE 802.3, the polynomial of zlib and
gzip), computed with :func:`zlib.crc32`; CRC-32C would be preferable on hardware that
accelerates it, but no CRC-32C implementation ships with the project's dependencies.

Directory layout
================

One directory per publication::

    <dir>/
      INCARNATION                    the incarnation id (see below)
      LOCK                           empty; flock()ed exclusively while a process has the log open
      00000000000000000001.seg       segment whose first seq is 1
      00000000000000000001.idx       index of that segment: a cache, never the truth
      00000000000000052117.seg       next segment: first seq 52117 (= previous last seq + 1)
      00000000000000052117.seg.torn-1048576
                                     bytes cut from a torn tail at recovery, kept for forensics
      *.tmp                          a small file being written; deleted when the log is opened

Segment names are the first seq as exactly 20 decimal digits (enough for 2**64 - 1) and
the suffix ``.seg``, so a lexical sort of the names is a numeric sort.  Segments are
contiguous: a segment's first seq is the previous segment's last seq plus one.  Only the
last segment is ever appended to; retention deletes whole segments, oldest first, and
never the last segment.

Small metadata files (INCARNATION, indexes, new segments' headers) are written as
``<name>.tmp``, fsynced, renamed over ``<name>``, and then the directory is fsynced.

INCARNATION
===========

36 ASCII bytes: a UUID4 in canonical lowercase form (``8-4-4-4-12`` hex digits), then
one ``\\n``.  37 bytes in all.  Created together with the directory (after the first
segment), never changed.  A directory with segments holding records but no INCARNATION,
or with an INCARNATION but no segment, is corrupt.

Segment file
============

A 16-byte segment header, then zero or more records back to back::

    offset  size  field
    0       4     magic  b"TXLS"
    4       1     format version, 1
    5       3     reserved, zero
    8       8     first seq of the segment (must equal the seq in the file name)

A new segment is written whole (header only) as a temp file, fsynced, renamed into
place and the directory fsynced, so a segment's header is never torn.

Record
======

A 20-byte record header, then the payload::

    offset  size  field
    0       4     magic  b"TXRE"
    4       4     payload length L in bytes (at most MAX_PAYLOAD)
    8       8     seq
    16      4     CRC over bytes 0..15 of this header followed by the L payload bytes
    20      L     payload: the entry exactly as appended (opaque bytes)

The record is the unit of durability and of integrity: a reader checks magic, length,
seq (the expected one: first seq of the segment + position) and CRC of every record it
reads from the file, and raises CorruptLogError(path, offset) rather than return a
damaged entry.  (The entries appended last are also kept in memory, and read from
there: ``_recent``.)

Torn tail versus corruption
===========================

Scanning a segment stops at the first offset X where a record is invalid (short
header, bad magic, length past the end of the file, wrong seq, CRC mismatch).

* In the last segment, if no valid record (magic, length within the file and CRC all
  good) starts anywhere after X, the bytes X..end are a torn tail: an append that did
  not complete before a crash.  They are copied to ``<segment>.torn-<X>`` (fsynced), the
  segment is truncated to X, and a warning names the byte range.
* Otherwise (damage in any segment but the last, or a valid record after the damage)
  the log is corrupt: opening raises CorruptLogError naming the file and offset X.

A single flipped bit inside the very last record is indistinguishable from a torn
append and is therefore treated as one (and kept aside in the ``.torn-`` file).

Preallocated space (the active segment)
=======================================

The writer keeps zeroed space after the last record of the active segment: a small
group-commit round (under ``PREALLOC_ROUND`` bytes) that would write past the file's
end also writes ``PREALLOC_BYTES`` of zeros after its records, in the same round,
before its fdatasync.  The rounds after it overwrite those zeros in place, so the
file's size does not change and their fdatasync has no size to journal (ext4: no
journal commit per round; measured in docs/performance.md).  Larger rounds (a
backlog) only append, as before, and so does a round that finds no room for the
zeros (a full disk: the zeros are optional, the records are not).  So a segment's end
is the end of its last valid record, not the file's end; what follows is zeros or a
torn round.

* Reading: unchanged.  Records are found by walking from the header or an index
  offset, never from the file's size; readers see only durable records (the head).
* Open, the last segment: the scan stops at the first invalid record, X.  A zero
  magic is never valid, so the scan stops at the zeros.  Z is where the file's
  trailing run of zeros begins (Z >= X).
  - Z == X: nothing but preallocated space follows: the file is truncated to X
    (fsynced), no ``.torn-`` file, an info line.  This is the state after any kill -9.
  - Z > X and no valid record after X: a torn round, as above (X..Z kept aside).
  - Z > X and a valid record R after X: corruption as above, unless some
    4096-byte-aligned block between X and R is all zeros.  The pages of one round's
    write reach the disk in any order before its fdatasync returns, and preallocated
    space reads as zeros where a page never reached it: after an OS crash the records
    of an unfinished round may lie beyond such a hole.  Nothing after X was durable
    (X's round never completed its fdatasync, and every later record is in that round
    or a later one), so X..Z is a torn round: kept aside, truncated, warned about.
    Traded: a lost write that zeroes a whole block of durable records in the last
    segment is now cut (loudly, the bytes kept aside) rather than refused; a
    subscriber that applied them is then refused as ahead of the head.
  Then the writer preallocates again at its next small round.
* Sealing (roll) and close truncate the segment to its last record, fsynced, so
  sealed segments, their index (whose size field is the file's size) and a log
  closed cleanly hold no zeros: code before this layout opens them unchanged, and
  after a kill -9 it sees the zeros as a torn tail (kept aside, then cut).
* Old logs (no zeros) open as before; the writer starts preallocating at its first
  small round.

Index file (a cache)
====================

``<first seq>.idx`` next to each segment that is no longer appended to.  It records the
byte offset of every INDEX_INTERVAL-th record, so that a read finds its starting point
without scanning::

    offset  size  field
    0       4     magic  b"TXIX"
    4       1     format version, 1
    5       3     reserved, zero
    8       8     first seq of the segment
    16      8     record count N of the segment
    24      8     size in bytes of the segment file it describes
    32      4     interval K
    36      4     number M of offsets, = ceil(N / K)
    40      8*M   offset of the record with seq first + i*K, for i in 0..M-1
    40+8*M  4     CRC over all preceding bytes of the file

The index is only a cache: when it is missing, fails its CRC, or disagrees with the
segment (first seq, size, interval), it is ignored, rebuilt by scanning the segment,
and rewritten.  Deleting every ``.idx`` file is always safe.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

SEGMENT_SUFFIX: Final = ".seg"
INDEX_SUFFIX: Final = ".idx"
TMP_SUFFIX: Final = ".tmp"
TORN_INFIX: Final = ".torn-"
INCARNATION_NAME: Final = "INCARNATION"
LOCK_NAME: Final = "LOCK"
SEQ_DIGITS: Final = 20

SEGMENT_MAGIC: Final = b"TXLS"
RECORD_MAGIC: Final = b"TXRE"
INDEX_MAGIC: Final = b"TXIX"
FORMAT_VERSION: Final = 1

SEGMENT_HEADER = struct.Struct(">4sB3xQ")
SEGMENT_HEADER_SIZE: Final = SEGMENT_HEADER.size  # 16
RECORD_PREFIX = struct.Struct(">4sIQ")  # the CRC-covered part of the record header
RECORD_HEADER = struct.Struct(">4sIQI")
RECORD_HEADER_SIZE: Final = RECORD_HEADER.size  # 20
CRC = struct.Struct(">I")
INDEX_HEADER = struct.Struct(">4sB3xQQQII")
INDEX_HEADER_SIZE: Final = INDEX_HEADER.size  # 40

MAX_PAYLOAD: Final = 1 << 30
INDEX_INTERVAL: Final = 32
PREALLOC_BYTES: Final = 1 << 20  # zeros written ahead of the active segment's end
PREALLOC_ROUND: Final = 64 << 10  # rounds at least this large only append
ZERO_BLOCK: Final = 4096  # the unit in which a crashed round's pages may go missing

assert SEGMENT_HEADER_SIZE == 16
assert RECORD_HEADER_SIZE == 20
assert INDEX_HEADER_SIZE == 40


def segment_name(first_seq: int) -> str:
    """Return the file name of the segment whose first seq is ``first_seq``."""
    return f"{first_seq:0{SEQ_DIGITS}d}{SEGMENT_SUFFIX}"


def index_name(first_seq: int) -> str:
    """Return the file name of the index of the segment whose first seq is ``first_seq``."""
    return f"{first_seq:0{SEQ_DIGITS}d}{INDEX_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """Return the first seq encoded in a segment file name, or None if it is not one."""
    if len(name) != SEQ_DIGITS + len(SEGMENT_SUFFIX) or not name.endswith(SEGMENT_SUFFIX):
        return None
    digits = name[:SEQ_DIGITS]
    if not digits.isascii() or not digits.isdigit():
        return None
    seq = int(digits)
    return seq if seq >= 1 else None


def encode_segment_header(first_seq: int) -> bytes:
    """Return the 16-byte header of a segment starting at ``first_seq``."""
    return SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, first_seq)


def decode_segment_header(data: bytes) -> int | None:
    """Return the first seq of a segment header, or None if the header is invalid."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return None
    magic, version, first_seq = SEGMENT_HEADER.unpack_from(data, 0)
    reserved = data[5:8]
    if magic != SEGMENT_MAGIC or version != FORMAT_VERSION or reserved != b"\0\0\0":
        return None
    if first_seq < 1:
        return None
    return int(first_seq)


def record_crc(prefix: bytes, payload: bytes) -> int:
    """Return the CRC of a record: its 16-byte header prefix, then its payload."""
    return zlib.crc32(payload, zlib.crc32(prefix))


def encode_record(seq: int, payload: bytes) -> bytes:
    """Return one framed record (header and payload)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    prefix = RECORD_PREFIX.pack(RECORD_MAGIC, len(payload), seq)
    return b"".join((prefix, CRC.pack(record_crc(prefix, payload)), payload))


def encode_records(first_seq: int, payloads: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """Frame consecutive records from ``first_seq``.

    Returns the bytes to write and the start offset of each record within them.
    """
    parts: list[bytes] = []
    starts: list[int] = []
    pos = 0
    pack_prefix = RECORD_PREFIX.pack
    pack_crc = CRC.pack
    crc32 = zlib.crc32
    for i, payload in enumerate(payloads):
        n = len(payload)
        if n > MAX_PAYLOAD:
            raise ValueError(f"payload of {n} bytes exceeds {MAX_PAYLOAD}")
        prefix = pack_prefix(RECORD_MAGIC, n, first_seq + i)
        parts.append(prefix)
        parts.append(pack_crc(crc32(payload, crc32(prefix))))
        parts.append(payload)
        starts.append(pos)
        pos += RECORD_HEADER_SIZE + n
    return b"".join(parts), starts


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """A decoded record header (not yet checked against its payload)."""

    length: int
    seq: int
    crc: int


def decode_record_header(buf: bytes | mmap.mmap, offset: int) -> RecordHeader | None:
    """Decode the record header at ``offset``; None if short or the magic is wrong."""
    if offset + RECORD_HEADER_SIZE > len(buf):
        return None
    magic, length, seq, crc = RECORD_HEADER.unpack_from(buf, offset)
    if magic != RECORD_MAGIC or length > MAX_PAYLOAD:
        return None
    return RecordHeader(length, seq, crc)


def encode_incarnation(incarnation: str) -> bytes:
    """Return the content of the INCARNATION file."""
    return incarnation.encode("ascii") + b"\n"
