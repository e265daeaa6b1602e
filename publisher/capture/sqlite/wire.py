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
int, or a float its scale  DECIMAL                        decimal text (3)
keeps
str in isoformat's form,   TIMESTAMPTZ                    timestamptz (11)
with an offset
=========================  =============================  =====================

Anything else (BOOLEAN, dates and times, a value of another storage class, text
that is not UTF-8) goes through ``encode_stored`` and ``SerializeToString``.
:func:`image_wire` goes from a packed row image (shapes.py, "The row image") straight
to those bytes: a TEXT value's stored bytes are its wire bytes once they are checked
to be UTF-8, a BLOB's are as they are, an integer literal is read by ``int``; the
other values are read as images.py reads them and written by :func:`value_bytes`.
A ``RowChange`` is then written field by field in field-number order (table 1, op 2,
each key Value 3, each row Value 4), the order upb serializes in, and parsed once,
in C, into the op the log receives: the bytes logged are the same as before.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Sequence

from common.rpc import txrepl_pb2 as pb
from common.values import EPOCH_UTC, sqlite_text_factory, to_decimal
from publisher.capture.protowire import (
    BLOB_TAG,
    DECIMAL_TAG,
    FLOAT_TAG,
    INT_TAG,
    JSON_TAG,
    NULL,
    TEXT_TAG,
    TZ_TAG,
    double,
    length,
    varint,
    zigzag,
)
from publisher.capture.sqlite.exact import encode_stored
from publisher.capture.sqlite.images import decode_image, parse_sql_literal

__all__ = ["image_wire", "row_op", "value_bytes"]

_INTEGER = int(pb.COLUMN_TYPE_INTEGER)
_DECIMAL = int(pb.COLUMN_TYPE_DECIMAL)
_TIMESTAMPTZ = int(pb.COLUMN_TYPE_TIMESTAMPTZ)
_FLOAT = int(pb.COLUMN_TYPE_FLOAT)
_TEXT = int(pb.COLUMN_TYPE_TEXT)
_JSON = int(pb.COLUMN_TYPE_JSON)
_BYTES = int(pb.COLUMN_TYPE_BYTES)

_INF = float("inf")


def _decimal(v: int | float, scale: int) -> bytes | None:
    """A DECIMAL column's int, or float that its scale keeps (exact.py), as the
    decimal text; None when the float travels as stored or the text cannot be made."""
    try:
        d = to_decimal(v, scale)
        if d is None or (type(v) is float and d != decimal.Decimal(repr(v))):
            return None
    except decimal.InvalidOperation:
        return None
    return length(DECIMAL_TAG, str(d).encode())


def _timestamptz(v: str) -> bytes | None:
    """ISO text with an offset, already in ``isoformat``'s form (exact.py), as the
    instant and its offset; None for any other text."""
    try:
        ts = dt.datetime.fromisoformat(v)
    except ValueError:
        return None
    off = ts.utcoffset()
    if off is None or ts.isoformat() != v:
        return None
    delta = ts - EPOCH_UTC
    utc = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    offset = off.days * 86_400 + off.seconds  # whole seconds: isoformat() printed them
    body = (b"\x08" + zigzag(utc) if utc else b"") + (b"\x10" + zigzag(offset) if offset else b"")
    return length(TZ_TAG, body)


def value_bytes(v: object, ctype: int, scale: int) -> bytes:
    """``encode_stored(v, ctype, scale).SerializeToString()``, fast for the plain forms."""
    if v is None:
        return NULL
    kind = type(v)
    got: bytes | None = None
    if kind is int:
        if ctype == _INTEGER and -(2**63) <= v < 2**63:  # type: ignore[operator]
            return INT_TAG + zigzag(v)  # type: ignore[arg-type]
        if ctype == _FLOAT and -(2**53) <= v <= 2**53:  # type: ignore[operator]
            return FLOAT_TAG + double(float(v))  # type: ignore[arg-type]
        if ctype == _DECIMAL:
            got = _decimal(v, scale)  # type: ignore[arg-type]
    elif kind is float:
        if ctype == _FLOAT:
            return FLOAT_TAG + double(v)
        if ctype == _DECIMAL and v == v and v != _INF and v != -_INF:
            got = _decimal(v, scale)  # type: ignore[arg-type]
            if got is None:  # the scale would round it: the float as stored
                return FLOAT_TAG + double(v)
    elif kind is str:
        if ctype == _TIMESTAMPTZ:
            got = _timestamptz(v)  # type: ignore[arg-type]
        if ctype in (_TEXT, _JSON):
            try:
                data = v.encode()  # type: ignore[attr-defined]
            except UnicodeEncodeError:  # surrogate escapes: text_bytes, by encode_stored
                pass
            else:
                return length(TEXT_TAG if ctype == _TEXT else JSON_TAG, data)
    elif kind is bytes and ctype == _BYTES:
        return length(BLOB_TAG, v)  # type: ignore[arg-type]
    if got is not None:
        return got
    return encode_stored(v, ctype, scale).SerializeToString()


_T, _B, _COLON, _COMMA = ord("t"), ord("b"), ord(":"), ord(",")


def image_wire(image: object, types: Sequence[tuple[int, int]]) -> list[bytes]:
    """The serialized Values of a row image's first ``len(types)`` values, each
    ``value_bytes(v, type, scale)`` of the value images.py reads there."""
    if not isinstance(image, bytes):  # the JSON format of older builds
        return [value_bytes(x, *ts) for x, ts in zip(decode_image(image), types, strict=False)]
    out: list[bytes] = []
    data = image
    i, end = 0, len(data)
    for t, s in types:
        if i >= end:
            break
        tag = data[i]
        if tag in (_T, _B):
            colon = data.index(_COLON, i)
            start = colon + 1
            i = start + int(data[i + 1 : colon])
            raw = data[start:i]
            if tag == _B:
                out.append(length(BLOB_TAG, raw) if t == _BYTES else value_bytes(raw, t, s))
                continue
            if t in (_TEXT, _JSON):
                try:
                    raw.decode()
                except UnicodeDecodeError:  # kept as stored: text_bytes
                    pass
                else:
                    out.append(length(TEXT_TAG if t == _TEXT else JSON_TAG, raw))
                    continue
            out.append(value_bytes(sqlite_text_factory(raw), t, s))
            continue
        comma = data.index(_COMMA, i)
        literal = data[i:comma]
        i = comma + 1
        if literal == b"NULL":
            out.append(NULL)
            continue
        try:
            v: object = int(literal)
        except ValueError:  # a real, Inf, a quoted literal
            v = parse_sql_literal(literal.decode("ascii"))
        out.append(value_bytes(v, t, s))
    return out


def row_op(table: bytes, op: int, key: list[bytes] | None, row: list[bytes] | None) -> pb.Op:
    """An ``Op`` holding the row change: ``table`` (UTF-8), ``op`` (a RowOp), and the
    key's and row's serialized Values (None: the field is absent)."""
    parts = [length(b"\x0a", table)] if table else []
    if op:
        parts.append(b"\x10" + varint(op))
    for tag, values in ((b"\x1a", key), (b"\x22", row)):
        if values is not None:
            parts.extend(length(tag, v) for v in values)
    return pb.Op.FromString(length(b"\x0a", b"".join(parts)))
