"""Captured row changes written straight to protobuf wire bytes (capture's hot loop).

Building a ``pb.Value`` object per value and a ``RowChange`` around them cost about
36 us per W1 row (2026-11-25, ``build_entries`` of 20,000 captured rows): the enum
lookups, the coercion checks and the protobuf wrappers of about five values.  A
backlog of 235,000 rows (both daemons down during the W1 stream) took the publisher
8.5 s to build, while the subscriber applies it in 1.5 s.

Here a value whose form is plainly its column's own is written as the very bytes
``encode_stored(v, type, scale).SerializeToString()`` gives (exact.py stays the one
rule; this is its fast form, and a differential test holds the two equal):

=========================  =============================  =====================
value (Python type)        column type                    Value field (number)
=========================  =============================  =====================
None                       any                            null = true (1)
int (not bool)             INTEGER                        int, zigzag (2)
int (not bool) or float    FLOAT                          float, double (4)
str, valid UTF-8           TEXT                           text (5)
str, valid UTF-8           JSON                           json (12)
bytes                      BYTES                          blob (6)
=========================  =============================  =====================

Anything else (DECIMAL, BOOLEAN, dates and times, a value of another storage class,
text that is not UTF-8) goes through ``encode_stored`` and ``SerializeToString``.
A ``RowChange`` is then written field by field in field-number order (table 1, op 2,
each key Value 3, each row Value 4), the order upb serializes in, and parsed once,
in C, into the op the log receives: the bytes logged are the same as before.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from common.rpc import txrepl_pb2 as pb
from publisher.capture.sqlite.exact import encode_stored

__all__ = ["row_op", "value_bytes"]

_INTEGER = int(pb.COLUMN_TYPE_INTEGER)
_FLOAT = int(pb.COLUMN_TYPE_FLOAT)
_TEXT = int(pb.COLUMN_TYPE_TEXT)
_JSON = int(pb.COLUMN_TYPE_JSON)
_BYTES = int(pb.COLUMN_TYPE_BYTES)

_NULL = b"\x08\x01"  # field 1 (varint), true
_INT_TAG = b"\x10"  # field 2, varint
_FLOAT_TAG = b"\x21"  # field 4, 64-bit
_TEXT_TAG = b"\x2a"  # field 5, length-delimited
_BLOB_TAG = b"\x32"  # field 6
_JSON_TAG = b"\x62"  # field 12
_double = struct.Struct("<d").pack
_SMALL = [bytes([n]) for n in range(128)]  # one-byte varints


def _varint(n: int) -> bytes:
    """``n`` (0 <= n < 2**64) as a protobuf varint."""
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length(tag: bytes, data: bytes) -> bytes:
    n = len(data)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + data


def value_bytes(v: object, ctype: int, scale: int) -> bytes:
    """``encode_stored(v, ctype, scale).SerializeToString()``, fast for the plain forms."""
    if v is None:
        return _NULL
    kind = type(v)
    if kind is int:
        if ctype == _INTEGER and -(2**63) <= v < 2**63:  # type: ignore[operator]
            n: int = v  # type: ignore[assignment]
            return _INT_TAG + _varint(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)
        if ctype == _FLOAT and -(2**53) <= v <= 2**53:  # type: ignore[operator]
            return _FLOAT_TAG + _double(float(v))  # type: ignore[arg-type]
    elif kind is float:
        if ctype == _FLOAT:
            return _FLOAT_TAG + _double(v)
    elif kind is str:
        if ctype in (_TEXT, _JSON):
            try:
                data = v.encode()  # type: ignore[attr-defined]
            except UnicodeEncodeError:  # surrogate escapes: text_bytes, by encode_stored
                pass
            else:
                return _length(_TEXT_TAG if ctype == _TEXT else _JSON_TAG, data)
    elif kind is bytes and ctype == _BYTES:
        return _length(_BLOB_TAG, v)  # type: ignore[arg-type]
    return encode_stored(v, ctype, scale).SerializeToString()


def row_op(
    table: bytes,
    op: int,
    key: Iterable[tuple[object, tuple[int, int]]] | None,
    row: Iterable[tuple[object, tuple[int, int]]] | None,
) -> pb.Op:
    """An ``Op`` holding the row change: ``table`` (UTF-8), ``op`` (a RowOp), and the
    key's and row's (value, (type, scale)) pairs (None: the field is absent)."""
    parts = [_length(b"\x0a", table)] if table else []
    if op:
        parts.append(b"\x10" + _varint(op))
    for tag, values in ((b"\x1a", key), (b"\x22", row)):
        if values is not None:
            for v, (t, s) in values:
                parts.append(_length(tag, value_bytes(v, t, s)))
    return pb.Op.FromString(_length(b"\x0a", b"".join(parts)))
