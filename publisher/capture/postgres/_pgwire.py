"""PostgreSQL row changes written straight to protobuf wire bytes (capture's hot loop).

Building a ``pb.Value`` per value, extending a ``RowChange`` with them (a copy),
sizing the ``Op`` and extending the ``Entry`` with it (another copy), with a parsed
event object and a tuple of strings per row before that, was most of the capture
thread's time per W1 transaction (py-spy, 2026-11-25: ``_change`` ~40 %, the parse
~20 %).  Here each column of a relation gets, once, a function from its text output
to the bytes ``to_value(text, info).SerializeToString()`` gives (``_pgtypes.py``
stays the one rule: both read the text with the same functions, and a differential
test holds the two equal over every type and its extremes).

:meth:`RowWriter.from_message` reads a pgoutput I, U or D message straight into its
Op: each cell of the TupleData is decoded (UTF-8, as the parser does) and handed to
its column's function, and the Value's bytes are framed as they come; of an old row
('K' or 'O') only the key's columns are written, the others are decoded and
dropped.  Any message it does not take whole (a cell neither text nor NULL: an
unchanged TOAST value, binary; a column count other than the relation's; a message
cut short or of another form) returns None, and the session reads it through
``parse_pgoutput`` and the events as before, which refuses or handles it: the fast
path only ever sees what the generic one would write the same bytes for (a
differential test over random messages holds them equal).  The session appends the
ops' bytes without building an Entry (``Publication.append_encoded``).

The bytes, in field-number order (upb's order; ``protowire.py`` for the
primitives)::

    Op         0a len RowChange                    (row = 1)
    RowChange  0a len table                        (table = 1, UTF-8)
               10 op                               (op = 2: 1 insert, 2 update, 3 delete)
               1a len Value ...                    (key = 3: update and delete)
               22 len Value ...                    (row = 4: insert and update)
    Entry ops  1a len Op ...                       (ops = 3; ``protowire.framed``)

    Value      08 01                 NULL
               10 zigzag             INTEGER        (sint64; outside it: text)
               1a len text           DECIMAL        (``decimal_text``)
               21 8 bytes LE         FLOAT          (double)
               2a len UTF-8          TEXT, and every type carried as text
               32 len bytes          BYTES          (``bytea``)
               38 00 | 01            BOOLEAN
               40 zigzag             DATE           (sint32 days since 1970-01-01)
               48 zigzag             TIME           (sint64 us since midnight)
               50 zigzag             TIMESTAMP      (sint64 us since 1970-01-01)
               5a len (08 zigzag)?   TIMESTAMPTZ    (utc_us; offset_s always 0,
                                                     so never written; utc_us 0:
                                                     an empty message)
               62 len UTF-8          JSON

A cell is read from the message's bytes, not a decoded str, and each column's
function returns its Value already framed (``22 len Value``; a key's ``1a`` is put
in place of the ``22``): a text is its bytes once they are valid UTF-8 (decoding and
encoding again gives them back; ASCII needs no decoding), an integer is ``int()`` of
the bytes (it reads ASCII as it reads the str, and refuses the rest, which
``to_value`` then reads), zigzagged and looked up whole below 2**14 (every W1 account
id) or by its low 14 bits and the rest below 2**28, and a numeric(p, s) text already
in ``decimal_text``'s form (``_decimal`` has the bounds) is its bytes; the other
types decode the text and read it with ``_pgtypes``.  The events' path encodes its
str and goes through the same functions: one rule.  W1's row messages 5.9 -> 4.1 us
each (docs/performance.md).  The date and time types are set on a Value the column
keeps and serialized by upb (0.27 us against 0.44-0.86 for a varint written in
Python).
A Value is a oneof: its member is written even when it holds its type's zero
(``Value(int=0)`` is ``10 00``), unlike the plain fields of RowChange and
TimestampTz.  A text whose reading fails (``infinity``, BC dates, ``24:00:00``,
an integer past 64 bits, ...) goes through ``to_value``, which carries it as
text; an unchanged TOAST marker where a value is needed is refused.  A RowWriter
keeps Values of its own: it is used by the one capture thread.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence

from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres._pgoutput import Datum
from publisher.capture.postgres._pgtypes import (
    TypeInfo,
    boolean,
    bytea,
    date_days,
    decimal_text,
    quantum_of,
    time_us,
    timestamp_us,
    timestamptz_us,
    to_value,
)
from publisher.capture.protowire import (
    BLOB_TAG,
    BOOLEAN_TAG,
    DECIMAL_TAG,
    FLOAT_TAG,
    INT_TAG,
    JSON_TAG,
    NULL,
    SMALL,
    TEXT_TAG,
    double,
    length,
    varint,
)
from publisher.errors import SourceError

__all__ = ["RowWriter", "value_wire"]

T = pb.ColumnType
_FALLBACK = (ValueError, ArithmeticError, OverflowError)  # what to_value carries as text
_TRUE, _FALSE = BOOLEAN_TAG + b"\x01", BOOLEAN_TAG + b"\x00"
_KEY, _ROW = b"\x1a", b"\x22"  # RowChange.key, RowChange.row

Wire = Callable[[str], bytes]
Cell = Callable[[bytes], bytes]  # a cell's text output, as sent -> ``22 len Value``


def _kept(m: pb.Value, field: str, read: Callable[[str], int]) -> Wire:
    """``read(s)`` set as ``field`` of the kept Value ``m``, serialized."""

    def wire(s: str) -> bytes:
        setattr(m, field, read(s))
        return m.SerializeToString()

    return wire


_ZIGZAG: dict[int, tuple[str, Callable[[str], int]]] = {
    T.COLUMN_TYPE_DATE: ("date", date_days),
    T.COLUMN_TYPE_TIME: ("time_us", time_us),
    T.COLUMN_TYPE_TIMESTAMP: ("timestamp_us", timestamp_us),
}


def _fast(ctype: int, scale: int) -> Wire:
    """text output -> the Value's bytes (raising as the reading of ``_pgtypes`` does),
    for the types :func:`_cell` reads through their decoded text.

    The varint types set a Value kept for the column and let upb serialize it: faster
    than a varint written in Python (0.27 against 0.44-0.86 us), and the same bytes
    as ``to_value``'s.
    """
    m = pb.Value()
    if ctype == T.COLUMN_TYPE_DECIMAL:
        quantum = quantum_of(scale)
        return lambda s: length(DECIMAL_TAG, decimal_text(s, quantum).encode())
    if ctype == T.COLUMN_TYPE_FLOAT:
        return lambda s: FLOAT_TAG + double(float(s))
    if ctype == T.COLUMN_TYPE_BYTES:
        return lambda s: length(BLOB_TAG, bytea(s))
    if ctype == T.COLUMN_TYPE_BOOLEAN:
        return lambda s: _TRUE if boolean(s) else _FALSE
    if ctype in _ZIGZAG:
        return _kept(m, *_ZIGZAG[ctype])
    raise AssertionError(ctype)  # integers and texts are read as bytes (_cell)


def _row(v: bytes) -> bytes:
    """A Value's bytes framed as ``RowChange.row`` (``22 len Value``)."""
    n = len(v)
    return _ROW + (SMALL[n] if n < 128 else varint(n)) + v


_ROW_NULL = _row(NULL)
# An integer's framed Value by its zigzag z: whole below 2**14, else the varint's low
# 14 bits (two bytes, continued) and the rest below 2**14 (one or two bytes).
_INT_SMALL = [_row(INT_TAG + varint(z)) for z in range(1 << 14)]
_VAR14 = [varint(z) for z in range(1 << 14)]
_LOW14 = [bytes((z & 0x7F | 0x80, z >> 7 | 0x80)) for z in range(1 << 14)]
_INT3, _INT4 = _ROW + b"\x04" + INT_TAG, _ROW + b"\x05" + INT_TAG
# A text of n < 126 bytes framed: 22 (n + 2) 2a n, then the text.
_TEXT_HEAD = [_ROW + SMALL[n + 2] + TEXT_TAG + SMALL[n] for n in range(126)]
_JSON_HEAD = [_ROW + SMALL[n + 2] + JSON_TAG + SMALL[n] for n in range(126)]
_DECIMAL_HEAD = [_ROW + SMALL[n + 2] + DECIMAL_TAG + SMALL[n] for n in range(31)]


def _carried(info: TypeInfo) -> Cell:
    """``to_value``'s reading of a text the fast form refused (the rule, not a copy):
    UTF-8 checked as the parser does (UnicodeDecodeError: the message is refused)."""

    def carried(raw: bytes) -> bytes:
        return _row(to_value(raw.decode("utf-8"), info).SerializeToString())

    return carried


def _integer(info: TypeInfo) -> Cell:
    """``int()`` reads the bytes as it reads their text (ASCII digits, sign, blanks,
    underscores; anything else raises, and the text is then read by ``to_value``)."""
    m = pb.Value()
    carried = _carried(info)

    def integer(raw: bytes) -> bytes:
        try:
            n = int(raw)
        except ValueError:
            return carried(raw)
        z = n << 1 if n >= 0 else ~(n << 1)  # zigzag
        if z < 16_384:
            return _INT_SMALL[z]
        if z < 1 << 28:
            high = z >> 14
            return (_INT3 if high < 128 else _INT4) + _LOW14[z & 0x3FFF] + _VAR14[high]
        try:
            m.int = n  # upb: past 64 bits raises ValueError
        except ValueError:
            return carried(raw)
        return _row(m.SerializeToString())

    return integer


def _text(heads: list[bytes], tag: bytes) -> Cell:
    """A text carried as its bytes: valid UTF-8 is what decoding and encoding again
    gives back (the check the parser makes; ASCII needs no decoding)."""

    def text(raw: bytes) -> bytes:
        if not raw.isascii():
            raw.decode("utf-8")  # raises where the parser refuses the message
        n = len(raw)
        if n < 126:
            return heads[n] + raw
        return _row(tag + varint(n) + raw)

    return text


def _decimal(info: TypeInfo, fast: Wire) -> Cell:
    """numeric(p, s) for 0 < s <= 6: a text of exactly s decimals, no leading zero and
    at most 28 digits is what ``decimal_text`` gives back (quantize changes nothing at
    that exponent and cannot overflow the 28-digit context; ``str`` writes an exponent
    of -6 or more plainly).  Any other text is read by it."""
    read = _as_text(fast, info)
    scale = info.scale
    match = re.compile(rb"-?(?:0|[1-9][0-9]{0,%d})\.[0-9]{%d}" % (27 - scale, scale)).fullmatch

    def dec(raw: bytes) -> bytes:
        if match(raw) is None:
            return read(raw)
        return _DECIMAL_HEAD[len(raw)] + raw  # at most 30 bytes

    return dec if 0 < info.scale <= 6 else read


def _as_text(fast: Wire, info: TypeInfo) -> Cell:
    """The other types: the text decoded (UTF-8 checked) and read by ``_pgtypes``."""

    def read(raw: bytes) -> bytes:
        s = raw.decode("utf-8")
        try:
            return _row(fast(s))
        except _FALLBACK:
            return _row(to_value(s, info).SerializeToString())

    return read


def _timestamptz(info: TypeInfo) -> Cell:
    """``_as_text`` and ``_fast`` in one call for the commonest time column (every W1
    account update): the instant set on a Value the column keeps (offset_s stays 0),
    serialized by upb; a Value under 128 bytes."""
    m = pb.Value()
    tz = m.timestamptz

    def timestamptz(raw: bytes) -> bytes:
        s = raw.decode("utf-8")
        try:
            tz.utc_us = timestamptz_us(s)
        except _FALLBACK:
            return _row(to_value(s, info).SerializeToString())
        v = m.SerializeToString()
        return _ROW + SMALL[len(v)] + v

    return timestamptz


def _cell(info: TypeInfo) -> Cell:
    """A column's ``raw -> 22 len to_value(raw.decode(), info).SerializeToString()``."""
    ctype = int(info.ctype)
    if ctype == T.COLUMN_TYPE_INTEGER:
        return _integer(info)
    if ctype == T.COLUMN_TYPE_JSON:
        return _text(_JSON_HEAD, JSON_TAG)
    if ctype == T.COLUMN_TYPE_TIMESTAMPTZ:
        return _timestamptz(info)
    if ctype in _READ:
        fast = _fast(ctype, info.scale)
        if ctype == T.COLUMN_TYPE_DECIMAL:
            return _decimal(info, fast)
        return _as_text(fast, info)
    return _text(_TEXT_HEAD, TEXT_TAG)


_READ = frozenset(
    int(t)
    for t in (
        T.COLUMN_TYPE_DECIMAL,
        T.COLUMN_TYPE_FLOAT,
        T.COLUMN_TYPE_BYTES,
        T.COLUMN_TYPE_BOOLEAN,
        T.COLUMN_TYPE_DATE,
        T.COLUMN_TYPE_TIME,
        T.COLUMN_TYPE_TIMESTAMP,
    )
)


def value_wire(info: TypeInfo) -> Callable[[Datum], bytes]:
    """A column's ``d -> to_value(d, info).SerializeToString()`` (None: NULL)."""
    wire = _wire(_cell(info), info)

    def value(d: Datum) -> bytes:
        framed = wire(d)
        i = 1
        while framed[i] & 0x80:  # past the length's varint
            i += 1
        return framed[i + 1 :]

    return value


def _wire(cell: Cell, info: TypeInfo) -> Callable[[Datum], bytes]:
    """A parsed event's datum -> its framed Value (``22 len Value``)."""

    def wire(d: Datum) -> bytes:
        if d.__class__ is str:
            try:
                raw = d.encode()
            except UnicodeEncodeError:  # a lone surrogate (wal2json's escapes)
                return _row(to_value(d, info).SerializeToString())
            return cell(raw)
        if d is None:
            return _ROW_NULL
        raise SourceError("unchanged TOAST value where a full value is needed")

    return wire


_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_BAD = (struct.error, IndexError, UnicodeDecodeError)  # a message the parser refuses


def _image(buf: bytes, pos: int, cells: tuple[Cell | None, ...]) -> tuple[list[bytes], int] | None:
    """The TupleData at ``pos`` read straight into Values framed as ``RowChange.row``
    (``22 len Value``), and the position after it; None for anything but text and
    NULL cells, exactly ``len(cells)`` of them (the generic path then reads it, and
    refuses it or handles the unchanged TOAST values).  Raises one of ``_BAD`` where
    ``parse_pgoutput`` would refuse the message.  A column whose cell is None (an old
    row's column outside the key) is UTF-8 checked and not written."""
    (n,) = _I16(buf, pos)
    if n != len(cells):
        return None
    pos += 2
    end = len(buf)
    out: list[bytes] = []
    append = out.append
    for cell in cells:
        kind = buf[pos]
        if kind == 0x74:  # 't'
            (size,) = _I32(buf, pos + 1)
            pos += 5
            if size < 0 or pos + size > end:
                return None
            raw = buf[pos : pos + size]
            pos += size
            if cell is not None:
                append(cell(raw))
            elif not raw.isascii():
                raw.decode("utf-8")  # checked as the parser does
        elif kind == 0x6E:  # 'n'
            pos += 1
            if cell is not None:
                append(_ROW_NULL)
        else:
            return None
    return out, pos


class RowWriter:
    """One relation's row changes as serialized ``Op`` messages: from the events'
    tuples, or (:meth:`from_message`) straight from a pgoutput row message."""

    __slots__ = ("_cells", "_delete", "_insert", "_key", "_key_at", "_old", "_update", "_wires")

    def __init__(self, table: str, infos: Sequence[TypeInfo], key_idx: Sequence[int]) -> None:
        name = length(b"\x0a", table.encode()) if table else b""
        self._insert = name + b"\x10" + varint(pb.ROW_OP_INSERT)
        self._update = name + b"\x10" + varint(pb.ROW_OP_UPDATE)
        self._delete = name + b"\x10" + varint(pb.ROW_OP_DELETE)
        self._cells = tuple(_cell(i) for i in infos)
        self._wires = tuple(_wire(c, i) for c, i in zip(self._cells, infos, strict=True))
        self._key = tuple(key_idx)
        kept = sorted(set(self._key))
        # an old row's image holds the key's columns only, in column order
        self._old = tuple(c if n in kept else None for n, c in enumerate(self._cells))
        self._key_at = tuple(kept.index(k) for k in self._key)

    def _keys(self, image: Sequence[Datum]) -> list[bytes]:
        wires = self._wires
        return [_KEY + wires[k](image[k])[1:] for k in self._key]

    def _row(self, new: Sequence[Datum]) -> bytes:
        return b"".join([w(d) for w, d in zip(self._wires, new, strict=True)])

    def insert(self, new: Sequence[Datum]) -> bytes:
        return length(b"\x0a", self._insert + self._row(new))

    def update(self, key_image: Sequence[Datum], new: Sequence[Datum]) -> bytes:
        """``key_image``: the old row when the stream sent one, else the new row."""
        keys = b"".join(self._keys(key_image))
        return length(b"\x0a", self._update + keys + self._row(new))

    def delete(self, old: Sequence[Datum]) -> bytes:
        return length(b"\x0a", self._delete + b"".join(self._keys(old)))

    def from_message(self, buf: bytes) -> bytes | None:
        """The Op of an I, U or D message (the relation's own), as :meth:`insert`,
        :meth:`update` or :meth:`delete` of its parsed event would write it; None when
        the generic path must read it (a cell neither text nor NULL, a column count
        that is not the relation's, anything malformed: that path raises)."""
        try:
            tag = buf[0]
            kind = buf[5]
            if tag == 0x49:  # 'I'
                if kind != 0x4E:
                    return None
                got = _image(buf, 6, self._cells)
                if got is None:
                    return None
                return length(b"\x0a", self._insert + b"".join(got[0]))
            old: list[bytes] | None = None
            pos = 6
            if kind == 0x4B or kind == 0x4F:  # 'K', 'O'
                got = _image(buf, 6, self._old)
                if got is None:
                    return None
                kept, pos = got
                old = [_KEY + kept[i][1:] for i in self._key_at]
                if tag == 0x44:  # 'D'
                    return length(b"\x0a", self._delete + b"".join(old))
                kind = buf[pos]
                pos += 1
            if tag != 0x55 or kind != 0x4E:  # 'U' ... 'N'
                return None
            got = _image(buf, pos, self._cells)
            if got is None:
                return None
            row = got[0]
            if old is None:
                old = [_KEY + row[k][1:] for k in self._key]
            return length(b"\x0a", self._update + b"".join(old) + b"".join(row))
        except _BAD:
            return None
