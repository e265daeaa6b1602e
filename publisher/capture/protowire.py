"""Protobuf wire primitives for the captures that write entries as bytes.

The captures' hot loops (``sqlite/wire.py``, ``postgres/_pgwire.py``) write a row
change's Values as the very bytes upb would serialize, then let upb parse them
once: fewer Python objects per value than building ``pb.Value`` messages.  These
are the few pieces of the encoding they share (protobuf's "Encoding" guide):

* a **varint** is 7 bits per byte, low group first, the high bit set on every
  byte but the last; a ``sint32``/``sint64`` is first **zigzagged** (``0, -1, 1,
  -2`` -> ``0, 1, 2, 3``);
* a **tag** is ``field_number << 3 | wire_type`` as a varint (0 varint, 1
  64-bit, 2 length-delimited); every tag used here is one byte;
* a **length-delimited** field is its tag, its length as a varint, its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from common.rpc import txrepl_pb2 as pb

__all__ = [
    "BLOB_TAG",
    "BOOLEAN_TAG",
    "DECIMAL_TAG",
    "FLOAT_TAG",
    "INT_TAG",
    "JSON_TAG",
    "NULL",
    "SMALL",
    "TEXT_TAG",
    "TZ_TAG",
    "double",
    "entry_of",
    "framed",
    "length",
    "varint",
    "zigzag",
]

# The tags of a txrepl.v1.Value's fields (one oneof: a member is written even when
# it holds its type's zero, so ``Value(int=0)`` is ``10 00``).
NULL = b"\x08\x01"  # field 1 (varint), true
INT_TAG = b"\x10"  # field 2, sint64
DECIMAL_TAG = b"\x1a"  # field 3, length-delimited
FLOAT_TAG = b"\x21"  # field 4, 64-bit
TEXT_TAG = b"\x2a"  # field 5, length-delimited
BLOB_TAG = b"\x32"  # field 6
BOOLEAN_TAG = b"\x38"  # field 7, varint
TZ_TAG = b"\x5a"  # field 11, a TimestampTz message: utc_us 1, offset_s 2 (sint)
JSON_TAG = b"\x62"  # field 12

SMALL = [bytes([n]) for n in range(128)]  # one-byte varints
double = struct.Struct("<d").pack


def varint(n: int) -> bytes:
    """``n`` (0 <= n < 2**64) as a protobuf varint."""
    if n < 128:
        return SMALL[n]
    if n < 16_384:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if 1 << 49 <= n < 1 << 56:  # eight bytes, unrolled: a zigzagged time in microseconds
        return bytes((
            n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14 & 0x7F | 0x80, n >> 21 & 0x7F | 0x80,
            n >> 28 & 0x7F | 0x80, n >> 35 & 0x7F | 0x80, n >> 42 & 0x7F | 0x80, n >> 49,
        ))  # fmt: skip
    out = []
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: ``tag``, the length of ``data``, ``data``."""
    n = len(data)
    return tag + (SMALL[n] if n < 128 else varint(n)) + data


def zigzag(n: int) -> bytes:
    """A ``sint64`` (or an in-range ``sint32``) ``n`` as its zigzag varint."""
    return varint(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)


def framed(ops: Iterable[bytes]) -> bytes:
    """``ops`` (each a serialized Op) as the bytes of an Entry's ``ops`` field (3)."""
    return b"".join([length(b"\x1a", op) for op in ops])


def entry_of(ops: Iterable[bytes]) -> pb.Entry:
    """An Entry holding ``ops`` (each a serialized Op), parsed once, in C."""
    return pb.Entry.FromString(framed(ops))
