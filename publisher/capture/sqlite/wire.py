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
:func:`image_fields` goes from a packed row image (shapes.py, "The row image") straight
to those bytes, each Value already inside its key (3) or row (4) field, in one pass
per image: a TEXT value's stored bytes are its wire bytes once they are checked to be
UTF-8, a BLOB's are as they are, an integer literal is read by ``int`` and zigzagged
in place, a DECIMAL column's plain real literal is its decimal text when that is
provably what exact.py gives (:func:`_decimal_literal`); the other values are read
as images.py reads them and written by :func:`value_bytes`.  (One pass with the
common forms inline: ``build_entries`` of a W1 backlog 10.2 -> 7.4 us per row,
2026-11-25, against a list of Values per image wrapped again by ``row_op``.)
A ``RowChange`` is then written field by field in field-number order (table 1, op 2,
each key Value 3, each row Value 4), the order upb serializes in, inside its ``Op``
(field 1); an entry's ops are framed as ``Entry.ops`` (``protowire.entry_of``) and
parsed once, in C, into the entry the log receives: the bytes logged are the same as before.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Sequence

from common.rpc import txrepl_pb2 as pb
from common.values import EPOCH_UTC, quantized, sqlite_text_factory, to_decimal
from publisher.capture.protowire import (
    BLOB_TAG,
    DECIMAL_TAG,
    FLOAT_TAG,
    INT_TAG,
    JSON_TAG,
    NULL,
    SMALL,
    TEXT_TAG,
    TZ_TAG,
    double,
    length,
    varint,
    zigzag,
)
from publisher.capture.sqlite.exact import encode_stored
from publisher.capture.sqlite.images import decode_image, parse_sql_literal

__all__ = ["image_fields", "row_op", "table_field", "value_bytes"]

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
        if type(v) is float:  # to_decimal's steps, the shortest repr read once
            exact = decimal.Decimal(repr(v))
            d: decimal.Decimal | None = quantized(exact, scale) if scale else exact
            if d != exact:
                return None
        else:
            d = to_decimal(v, scale)
            if d is None:
                return None
    except decimal.InvalidOperation:
        return None
    return length(DECIMAL_TAG, str(d).encode())


_MINUTES: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM" -> its seconds since the epoch, as UTC
_MINUTES_MAX = 4096


def _timestamptz(v: str) -> bytes | None:
    """ISO text with an offset, already in ``isoformat``'s form (exact.py), as the
    instant and its offset; None for any other text.

    The common forms, ``YYYY-MM-DDTHH:MM:SS[.ffffff]+HH:MM`` in ASCII digits, are
    read by slicing, the minute's seconds since the epoch cached (a stream's times
    share their minutes); the text must be exactly what ``isoformat`` prints
    (microseconds only when not zero, ``+00:00`` rather than ``-00:00``), and any
    other text takes :func:`_timestamptz_parsed`, the rule itself."""
    n = len(v)
    if (n == 25 or (n == 32 and v[19] == "." and v[20:26] != "000000")) and v.isascii():
        sign = v[n - 6]
        minute = _MINUTES.get(v[:16])
        if minute is None and (sign == "+" or sign == "-") and v[16] == ":":
            minute = _minute(v[:16])
        sec, hh, mm = v[17:19], v[n - 5 : n - 3], v[n - 2 :]
        if (
            minute is not None
            and v[n - 3] == ":"
            and sec.isdigit()
            and hh.isdigit()
            and mm.isdigit()
            and (n == 25 or v[20:26].isdigit())
            and (sign == "+" or (sign == "-" and (hh != "00" or mm != "00")))
        ):
            second, oh, om = int(sec), int(hh), int(mm)
            if second < 60 and oh < 24 and om < 60:
                offset = (oh * 3600 + om * 60) * (1 if sign == "+" else -1)
                micro = int(v[20:26]) if n == 32 else 0
                utc = (minute + second - offset) * 1_000_000 + micro
                body = (b"\x08" + zigzag(utc) if utc else b"") + (
                    b"\x10" + zigzag(offset) if offset else b""
                )
                return length(TZ_TAG, body)
    return _timestamptz_parsed(v)


def _minute(prefix: str) -> int | None:
    """Seconds since the epoch of ``YYYY-MM-DDTHH:MM`` read as UTC (cached); None when
    it is not that, exactly as ``isoformat`` prints it."""
    try:
        at = dt.datetime.fromisoformat(prefix)
    except ValueError:
        return None
    if at.isoformat()[:16] != prefix:
        return None
    delta = at.replace(tzinfo=dt.UTC) - EPOCH_UTC
    seconds = delta.days * 86_400 + delta.seconds
    if len(_MINUTES) >= _MINUTES_MAX:
        _MINUTES.clear()
    _MINUTES[prefix] = seconds
    return seconds


def _timestamptz_parsed(v: str) -> bytes | None:
    """:func:`_timestamptz` by ``datetime``'s own parser (any form; the rule)."""
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
_DIGITS = frozenset(b"0123456789")
_STRINGS = frozenset((_T, _B))  # the tags of a length-prefixed value in an image
_TEXTS = frozenset((_TEXT, _JSON))
_ZEROS = ["0" * n for n in range(7)]


def image_fields(image: object, types: Sequence[tuple[int, int]], tag: bytes) -> bytes:
    """A row image's first ``len(types)`` values, each as a ``tag`` field holding its
    serialized Value: ``b"".join(length(tag, value_bytes(v, type, scale)))`` over the
    values images.py reads there (the key, 3, or the row, 4, of a RowChange).

    One pass per image, the plain forms written without a call per value (2026-11-25:
    the build of a W1 backlog spent most of its time in per-value calls): a TEXT or
    JSON column's UTF-8 text, a BLOB column's blob, an INTEGER column's int, a FLOAT
    column's real, a DECIMAL column's real in plain notation whose fraction its scale
    keeps (:func:`_decimal_literal`), a TIMESTAMPTZ column's ASCII text; anything else
    through :func:`value_bytes`."""
    if not isinstance(image, bytes):  # the JSON format of older builds
        values = zip(decode_image(image), types, strict=False)
        return b"".join([length(tag, value_bytes(x, *ts)) for x, ts in values])
    out: list[bytes] = []
    data = image
    i, end = 0, len(data)
    for t, s in types:
        if i >= end:
            break
        c = data[i]
        if c in _STRINGS:
            colon = data.index(_COLON, i)
            start = colon + 1
            i = start + int(data[i + 1 : colon])
            raw = data[start:i]
            n = i - start
            if c == _B:
                value = length(BLOB_TAG, raw) if t == _BYTES else value_bytes(raw, t, s)
            elif t in _TEXTS:
                if raw.isascii() or _utf8(raw):
                    if n < 126:  # the Value and its field: one-byte lengths
                        out.append(
                            tag + SMALL[n + 2] + (TEXT_TAG if t == _TEXT else JSON_TAG)
                            + SMALL[n] + raw
                        )  # fmt: skip
                        continue
                    value = length(TEXT_TAG if t == _TEXT else JSON_TAG, raw)
                else:  # kept as stored: text_bytes
                    value = value_bytes(sqlite_text_factory(raw), t, s)
            elif t == _TIMESTAMPTZ and raw.isascii():
                text = raw.decode("ascii")
                value = _timestamptz(text) or value_bytes(text, t, s)
            else:
                value = value_bytes(sqlite_text_factory(raw), t, s)
        else:
            comma = data.index(_COMMA, i)
            literal = data[i:comma]
            i = comma + 1
            if literal == b"NULL":
                out.append(tag + b"\x02" + NULL)
                continue
            if b"." in literal:  # a real: no int() attempt, whose exception costs ~1 us
                if t == _DECIMAL:
                    got = _decimal_literal(literal, s)
                    if got is not None:
                        out.append(length(tag, got))
                        continue
                try:
                    v: object = float(literal)
                except ValueError:  # a quoted literal holding a dot
                    v = parse_sql_literal(literal.decode("ascii"))
                else:
                    if t == _FLOAT:
                        out.append(tag + b"\x09" + FLOAT_TAG + double(v))
                        continue
            else:
                try:
                    v = int(literal)
                except ValueError:  # a real written 1e+300, Inf, a quoted literal
                    v = parse_sql_literal(literal.decode("ascii"))
                else:
                    if t == _INTEGER and -(2**63) <= v < 2**63:
                        z = v << 1 if v >= 0 else ((-v) << 1) - 1  # zigzag
                        if z < 128:
                            out.append(tag + b"\x02" + INT_TAG + SMALL[z])
                        elif z < 16_384:
                            out.append(tag + b"\x03" + INT_TAG + bytes((z & 0x7F | 0x80, z >> 7)))
                        elif z < 2_097_152:
                            three = (z & 0x7F | 0x80, (z >> 7) & 0x7F | 0x80, z >> 14)
                            out.append(tag + b"\x04" + INT_TAG + bytes(three))
                        else:
                            out.append(length(tag, INT_TAG + varint(z)))
                        continue
            value = value_bytes(v, t, s)
        out.append(length(tag, value))
    return b"".join(out)


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _decimal_literal(literal: bytes, scale: int) -> bytes | None:
    """The Value of a DECIMAL column's real written ``[-]digits.digits`` by quote(),
    when that text padded to ``scale`` digits is what :func:`_decimal` gives; None
    otherwise (the caller takes the general path).

    Why it is: with at most 15 significant digits (DBL_DIG) a decimal text is the only
    one of that length that reads as its double, so it equals the double's shortest
    ``repr``, which ``_decimal`` reads; when its fraction has at most ``scale`` digits,
    quantizing only appends zeros; with ``scale`` <= 6 ``str`` of the result is plain
    notation even for zero (``Decimal('0E-7')`` is the first that is not)."""
    if not 0 < scale <= 6:
        return None
    body = literal[1:] if literal[:1] == b"-" else literal
    whole, _, fraction = body.partition(b".")
    if (
        not whole
        or not fraction
        or len(fraction) > scale
        or len(whole) + len(fraction) > 15
        or not _DIGITS.issuperset(whole)
        or not _DIGITS.issuperset(fraction)
    ):
        return None
    text = literal + _ZEROS[scale - len(fraction)].encode()
    return DECIMAL_TAG + SMALL[len(text)] + text


def table_field(table: bytes) -> bytes:
    """A RowChange's ``table`` field (1) for ``table`` (UTF-8); empty for no name."""
    return length(b"\x0a", table) if table else b""


_OP_FIELDS = {int(op): b"\x10" + varint(op) if op else b"" for op in pb.RowOp.values()}


def row_op(table: bytes, op: int, key: bytes | None, row: bytes | None) -> bytes:
    """The serialized ``Op`` holding the row change: ``table`` (its :func:`table_field`),
    ``op`` (a RowOp), and the key's and row's Values as :func:`image_fields` writes them
    (tags 3 and 4; None: the field is absent)."""
    body = table + _OP_FIELDS[op]
    if key is not None:
        body += key
    if row is not None:
        body += row
    return length(b"\x0a", body)
