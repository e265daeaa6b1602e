"""The sparse offset index of one segment, and its cache file (format in _framing)."""

from __future__ import annotations

import sys
import zlib
from array import array
from pathlib import Path

from ._framing import (
    CRC,
    FORMAT_VERSION,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_INTERVAL,
    INDEX_MAGIC,
)
from ._fsutil import atomic_write


def encode_index(first_seq: int, count: int, size: int, offsets: array[int]) -> bytes:
    """Return the bytes of an index file for a segment."""
    body = bytearray(
        INDEX_HEADER.pack(
            INDEX_MAGIC, FORMAT_VERSION, first_seq, count, size, INDEX_INTERVAL, len(offsets)
        )
    )
    big = array("Q", offsets)
    if big.itemsize != 8:  # pragma: no cover - every supported platform has 8-byte "Q"
        raise RuntimeError("array('Q') is not 64-bit on this platform")
    if _LITTLE:
        big.byteswap()
    body += big.tobytes()
    body += CRC.pack(zlib.crc32(body))
    return bytes(body)


def decode_index(data: bytes, first_seq: int, size: int) -> tuple[int, array[int]] | None:
    """Return (record count, offsets) from an index file, or None if it cannot be trusted.

    Untrusted means: short, bad magic/version/CRC, or describing another segment
    (first seq), another size of the segment, or another interval.
    """
    if len(data) < INDEX_HEADER_SIZE + CRC.size:
        return None
    (crc,) = CRC.unpack_from(data, len(data) - CRC.size)
    if zlib.crc32(data[: -CRC.size]) != crc:
        return None
    magic, version, f_seq, count, f_size, interval, m = INDEX_HEADER.unpack_from(data, 0)
    if (
        magic != INDEX_MAGIC
        or version != FORMAT_VERSION
        or f_seq != first_seq
        or f_size != size
        or interval != INDEX_INTERVAL
        or m != (count + INDEX_INTERVAL - 1) // INDEX_INTERVAL
        or len(data) != INDEX_HEADER_SIZE + 8 * m + CRC.size
    ):
        return None
    offsets = array("Q")
    offsets.frombytes(data[INDEX_HEADER_SIZE : INDEX_HEADER_SIZE + 8 * m])
    if _LITTLE:
        offsets.byteswap()
    prev = -1
    for off in offsets:
        if off <= prev or off >= size:
            return None
        prev = off
    return int(count), offsets


def load_index(path: Path, first_seq: int, size: int) -> tuple[int, array[int]] | None:
    """Read and check an index file; None when missing, unreadable or untrusted."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return decode_index(data, first_seq, size)


def save_index(path: Path, first_seq: int, count: int, size: int, offsets: array[int]) -> None:
    """Write an index file durably (tmp → fsync → rename → fsync dir)."""
    atomic_write(path, encode_index(first_seq, count, size, offsets))


_LITTLE = sys.byteorder == "little"
