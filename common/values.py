"""Typed column values: Python objects <-> ``txrepl.v1.Value``, and logical types.

Python representation of each logical type (what :func:`decode` returns and what
:func:`encode` accepts):

==============  ============================  ======================================
ColumnType      Python                        wire (``Value`` field)
==============  ============================  ======================================
INTEGER         ``int``                       ``int`` (sint64)
DECIMAL         ``decimal.Decimal``           ``decimal`` (canonical text, exact)
FLOAT           ``float``                     ``float`` (double)
TEXT            ``str``                       ``text``
BYTES           ``bytes``                     ``blob``
BOOLEAN         ``bool``                      ``boolean``
DATE            ``datetime.date``             ``date`` (days since 1970-01-01)
TIME            ``datetime.time``             ``time_us``
TIMESTAMP       naive ``datetime.datetime``   ``timestamp_us``
TIMESTAMPTZ     aware ``datetime.datetime``   ``timestamptz`` (UTC micros + offset)
JSON            ``str`` (JSON text)           ``json``
(TEXT)          :class:`RawText`              ``text_bytes``
==============  ============================  ======================================

:class:`RawText` is TEXT that is not valid UTF-8 (SQLite stores whatever bytes it is
given as TEXT): its bytes.  A source reads such text with
:func:`sqlite_text_factory` (undecodable bytes become surrogate escapes); an encoded
``str`` holding them travels as ``text_bytes``, and only a SQLite target can store it.

``None`` is SQL NULL.  :func:`encode` coerces what a source driver returns (SQLite
keeps decimals as REAL or TEXT, booleans as 0/1, dates as ISO text) into the
column's logical type; a value that cannot be coerced is carried with the type it
actually has, so nothing is ever lost or silently rounded.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import re
from collections.abc import Sequence

from common.rpc import txrepl_pb2 as pb

__all__ = [
    "ColumnType",
    "RawText",
    "decode",
    "decode_row",
    "encode",
    "encode_natural",
    "encode_row",
    "parse_declared_type",
    "quantized",
    "sqlite_text_factory",
    "to_datetime",
    "to_decimal",
]

ColumnType = pb.ColumnType

EPOCH_DATE = dt.date(1970, 1, 1)
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


class RawText(bytes):
    """TEXT that is not valid UTF-8: its bytes (see the module docstring)."""


def sqlite_text_factory(data: bytes) -> str:
    """A ``sqlite3`` text factory that reads any TEXT: bytes that are not UTF-8 become
    surrogate escapes, which :func:`encode_natural` carries as ``text_bytes``."""
    return data.decode("utf-8", "surrogateescape")


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def to_decimal(v: object, scale: int) -> decimal.Decimal | None:
    if isinstance(v, decimal.Decimal):
        d = v
    elif isinstance(v, bool):
        return None
    elif isinstance(v, int):
        d = decimal.Decimal(v)
    elif isinstance(v, float):
        # A REAL from SQLite's NUMERIC affinity: its shortest repr is what was written.
        d = decimal.Decimal(repr(v))
    elif isinstance(v, str):
        try:
            d = decimal.Decimal(v.strip())
        except decimal.InvalidOperation:
            return None
    else:
        return None
    if not d.is_finite():
        return d
    if scale:
        return quantized(d, scale)
    return d


def quantized(d: decimal.Decimal, scale: int) -> decimal.Decimal:
    """Finite ``d`` rounded to ``scale`` decimals (the context's rounding), however many
    digits that takes: the default context stops at 28 and raised InvalidOperation for,
    say, a 19-digit integer in a DECIMAL(30,12) column (found 2026-11-25)."""
    quantum = _quantum(scale)
    try:
        return d.quantize(quantum)
    except decimal.InvalidOperation:
        ctx = decimal.getcontext()
        wide = ctx.copy()
        wide.prec = max(ctx.prec, max(d.adjusted() + 1, 1) + scale)
        return d.quantize(quantum, context=wide)


@functools.cache
def _quantum(scale: int) -> decimal.Decimal:
    return decimal.Decimal(1).scaleb(-scale)


def _to_bool(v: object) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false", "t", "f", "1", "0"):
        return v.lower() in ("true", "t", "1")
    return None


def _to_date(v: object) -> dt.date | None:
    if isinstance(v, dt.datetime):
        return None
    if isinstance(v, dt.date):
        return v
    if isinstance(v, str):
        try:
            return dt.date.fromisoformat(v.strip())
        except ValueError:
            return None
    return None


def _to_time(v: object) -> dt.time | None:
    if isinstance(v, dt.time):
        return v
    if isinstance(v, str):
        try:
            return dt.time.fromisoformat(v.strip())
        except ValueError:
            return None
    return None


def to_datetime(v: object) -> dt.datetime | None:
    if isinstance(v, dt.datetime):
        return v
    if isinstance(v, str):
        try:
            return dt.datetime.fromisoformat(v.strip())
        except ValueError:
            return None
    return None


def _utf8(v: str) -> bool:
    try:
        v.encode()
    except UnicodeEncodeError:
        return False
    return True


def encode_natural(v: object, out: pb.Value) -> pb.Value:
    """Encode ``v`` by its own Python type (used when coercion is not possible)."""
    if v is None:
        out.null = True
    elif isinstance(v, bool):
        out.boolean = v
    elif isinstance(v, int):
        out.int = v
    elif isinstance(v, float):
        out.float = v
    elif isinstance(v, str):
        try:
            out.text = v
        except UnicodeEncodeError:  # surrogate escapes: sqlite_text_factory
            out.text_bytes = v.encode("utf-8", "surrogateescape")
    elif isinstance(v, RawText):
        out.text_bytes = bytes(v)
    elif isinstance(v, bytes | bytearray | memoryview):
        out.blob = bytes(v)
    elif isinstance(v, decimal.Decimal):
        out.decimal = str(v)
    elif isinstance(v, dt.datetime):
        if v.tzinfo is None:
            out.timestamp_us = _micros(v - EPOCH)
        else:
            off = v.utcoffset() or dt.timedelta(0)
            out.timestamptz.utc_us = _micros(v - EPOCH_UTC)
            out.timestamptz.offset_s = int(off.total_seconds())
    elif isinstance(v, dt.date):
        out.date = (v - EPOCH_DATE).days
    elif isinstance(v, dt.time):
        out.time_us = ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
    elif isinstance(v, dict | list):
        out.json = json.dumps(v, separators=(",", ":"), sort_keys=True)
    else:
        raise TypeError(f"cannot encode a value of type {type(v).__name__}: {v!r}")
    return out


# Plain ints: a protobuf enum attribute costs about 0.5 us per lookup, and encode()
# runs once per captured value.
_INTEGER = int(ColumnType.COLUMN_TYPE_INTEGER)
_DECIMAL = int(ColumnType.COLUMN_TYPE_DECIMAL)
_FLOAT = int(ColumnType.COLUMN_TYPE_FLOAT)
_TEXT = int(ColumnType.COLUMN_TYPE_TEXT)
_BYTES = int(ColumnType.COLUMN_TYPE_BYTES)
_BOOLEAN = int(ColumnType.COLUMN_TYPE_BOOLEAN)
_DATE = int(ColumnType.COLUMN_TYPE_DATE)
_TIME = int(ColumnType.COLUMN_TYPE_TIME)
_TIMESTAMP = int(ColumnType.COLUMN_TYPE_TIMESTAMP)
_TIMESTAMPTZ = int(ColumnType.COLUMN_TYPE_TIMESTAMPTZ)
_JSON = int(ColumnType.COLUMN_TYPE_JSON)


def encode(v: object, ctype: int = ColumnType.COLUMN_TYPE_UNSPECIFIED, scale: int = 0) -> pb.Value:
    """Encode ``v`` as a Value of logical type ``ctype`` (coercing source representations)."""
    out = pb.Value()
    if v is None:
        out.null = True
        return out
    coerced: object = None
    if ctype == _INTEGER:
        if isinstance(v, int) and not isinstance(v, bool):
            coerced = v
        elif isinstance(v, float) and v.is_integer() and -(2**63) <= v < 2**63:
            coerced = int(v)
    elif ctype == _DECIMAL:
        coerced = to_decimal(v, scale)
    elif ctype == _FLOAT:
        if isinstance(v, int | float) and not isinstance(v, bool):
            coerced = float(v)
    elif ctype == _TEXT:
        if isinstance(v, str):
            coerced = v
    elif ctype == _BYTES:
        if isinstance(v, bytes | bytearray | memoryview):
            coerced = bytes(v)
    elif ctype == _BOOLEAN:
        coerced = _to_bool(v)
    elif ctype == _DATE:
        coerced = _to_date(v)
    elif ctype == _TIME:
        coerced = _to_time(v)
    elif ctype in (_TIMESTAMP, _TIMESTAMPTZ):
        ts = to_datetime(v)
        if ts is not None and ctype == _TIMESTAMPTZ and ts.tzinfo is None:
            ts = ts.replace(tzinfo=dt.UTC)  # a zone-less text in a timestamptz column means UTC
        coerced = ts
    elif ctype == _JSON:
        if isinstance(v, str) and _utf8(v):  # else carried as text_bytes
            out.json = v
            return out
        if isinstance(v, dict | list):
            coerced = v
    if ctype == _DECIMAL and isinstance(coerced, decimal.Decimal):
        out.decimal = str(coerced)
        return out
    return encode_natural(v if coerced is None else coerced, out)


def decode(v: pb.Value) -> object:
    """Decode a Value into its Python representation (``None`` for NULL)."""
    kind = v.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "decimal":
        return decimal.Decimal(v.decimal)
    if kind == "text_bytes":
        return RawText(v.text_bytes)
    if kind == "date":
        return EPOCH_DATE + dt.timedelta(days=v.date)
    if kind == "time_us":
        us = v.time_us
        secs, micro = divmod(us, 1_000_000)
        mins, sec = divmod(secs, 60)
        hour, minute = divmod(mins, 60)
        return dt.time(hour, minute, sec, micro)
    if kind == "timestamp_us":
        return EPOCH + v.timestamp_us * _US
    if kind == "timestamptz":
        zone = dt.timezone(dt.timedelta(seconds=v.timestamptz.offset_s))
        return (EPOCH_UTC + v.timestamptz.utc_us * _US).astimezone(zone)
    return getattr(v, kind)


def encode_row(values: Sequence[object], types: Sequence[tuple[int, int]]) -> list[pb.Value]:
    """Encode a row given ``(ctype, scale)`` per column."""
    return [encode(v, t, s) for v, (t, s) in zip(values, types, strict=True)]


def decode_row(values: Sequence[pb.Value]) -> list[object]:
    return [decode(v) for v in values]


_DECL = re.compile(r"^\s*([A-Za-z_ ]+?)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*$")


def parse_declared_type(declared: str) -> tuple[int, int, int]:
    """Map a declared SQL type (SQLite or PostgreSQL spelling) to (ctype, precision, scale).

    Follows SQLite's affinity rules for anything it does not recognise, so every
    declared type maps to something.
    """
    m = _DECL.match(declared or "")
    name = (m.group(1) if m else declared or "").strip().upper()
    prec = int(m.group(2)) if m and m.group(2) else 0
    scale = int(m.group(3)) if m and m.group(3) else 0
    T = ColumnType
    exact = {
        "BOOLEAN": T.COLUMN_TYPE_BOOLEAN,
        "BOOL": T.COLUMN_TYPE_BOOLEAN,
        "DATE": T.COLUMN_TYPE_DATE,
        "TIME": T.COLUMN_TYPE_TIME,
        "TIME WITHOUT TIME ZONE": T.COLUMN_TYPE_TIME,
        "TIMESTAMP": T.COLUMN_TYPE_TIMESTAMP,
        "DATETIME": T.COLUMN_TYPE_TIMESTAMP,
        "TIMESTAMP WITHOUT TIME ZONE": T.COLUMN_TYPE_TIMESTAMP,
        "TIMESTAMPTZ": T.COLUMN_TYPE_TIMESTAMPTZ,
        "TIMESTAMP WITH TIME ZONE": T.COLUMN_TYPE_TIMESTAMPTZ,
        "JSON": T.COLUMN_TYPE_JSON,
        "JSONB": T.COLUMN_TYPE_JSON,
        "DECIMAL": T.COLUMN_TYPE_DECIMAL,
        "NUMERIC": T.COLUMN_TYPE_DECIMAL,
        "BYTEA": T.COLUMN_TYPE_BYTES,
    }
    if name in exact:
        ctype = exact[name]
        if ctype != T.COLUMN_TYPE_DECIMAL:
            prec = scale = 0
        return ctype, prec, scale
    # SQLite affinity rules, in SQLite's order.
    if "INT" in name:
        return T.COLUMN_TYPE_INTEGER, 0, 0
    if any(s in name for s in ("CHAR", "CLOB", "TEXT")):
        return T.COLUMN_TYPE_TEXT, 0, 0
    if "BLOB" in name or not name:
        return T.COLUMN_TYPE_BYTES if name else T.COLUMN_TYPE_UNSPECIFIED, 0, 0
    if any(s in name for s in ("REAL", "FLOA", "DOUB")):
        return T.COLUMN_TYPE_FLOAT, 0, 0
    return T.COLUMN_TYPE_DECIMAL, prec, scale
