"""Decoding the row images the capture triggers write (format: shapes.py, "The row image").

Two formats meet here: the packed image (a BLOB, written by current triggers) and
the JSON array of SQL literals (TEXT, written by builds before it, possibly still
in the capture table of an upgraded source).  The storage class tells them apart.
"""

from __future__ import annotations

import json
import sqlite3

from common.values import sqlite_text_factory

__all__ = ["decode_image", "image_values_at", "parse_sql_literal", "unpack"]

_T, _B, _COLON, _COMMA = ord("t"), ord("b"), ord(":"), ord(",")


def parse_sql_literal(text: str) -> object:
    """Parse one SQL literal as produced by SQLite's quote()."""
    if text == "NULL":
        return None
    first = text[0]
    if first == "'":
        return text[1:-1].replace("''", "'")
    if first in "Xx" and text[1:2] == "'":
        return bytes.fromhex(text[2:-1])
    if first == "t":  # TEXT holding a NUL, as its bytes (the JSON format's literal)
        return sqlite_text_factory(bytes.fromhex(text[3:-1]))
    if any(c in text for c in ".eE") or text in ("Inf", "-Inf"):
        return float(text)
    return int(text)


def unpack(data: bytes) -> list[object]:
    """The values of a packed image, in column order."""
    out: list[object] = []
    i, end = 0, len(data)
    while i < end:
        tag = data[i]
        if tag in (_T, _B):
            colon = data.index(_COLON, i)
            start = colon + 1
            stop = start + int(data[i + 1 : colon])
            raw = data[start:stop]
            out.append(sqlite_text_factory(raw) if tag == _T else raw)
            i = stop
        else:
            comma = data.index(_COMMA, i)
            out.append(parse_sql_literal(data[i:comma].decode("ascii")))
            i = comma + 1
    return out


def decode_image(image: object) -> list[object]:
    """The values of ``k`` or ``v`` as stored: packed (bytes) or JSON (older builds)."""
    if isinstance(image, bytes):
        return unpack(image)
    assert isinstance(image, str)
    return [parse_sql_literal(x) for x in json.loads(image)]


def image_values_at(
    conn: sqlite3.Connection, row_id: int, column: str, wanted: list[int], shown: int = 200
) -> list[object]:
    """Values ``wanted`` (column indexes) of the image in ``column`` of capture row
    ``row_id``, read piece by piece (the image itself may be too large to read);
    text and blobs cut to ``shown`` bytes.  For naming a row (errors), not for data."""
    where = "FROM _txrepl_capture WHERE id = ?"
    kind = conn.execute(f"SELECT typeof({column}) {where}", (row_id,)).fetchone()
    if kind is None or not wanted:
        return []
    if kind[0] == "text":  # the JSON format (older builds)
        parts = ", ".join(f"json_extract({column}, '$[{i}]')" for i in wanted)
        row = conn.execute(f"SELECT {parts} {where}", (row_id,)).fetchone()
        return [None if x is None else parse_sql_literal(str(x)) for x in row]

    def part(start: int, n: int) -> bytes:  # substr of a BLOB counts bytes, from 1
        got = conn.execute(f"SELECT substr({column}, ?, ?) {where}", (start, n, row_id))
        return bytes(got.fetchone()[0])

    values: dict[int, object] = {}
    pos = 1
    for index in range(max(wanted) + 1):
        head = part(pos, 64)
        if head[0] in (_T, _B):
            colon = head.index(_COLON)
            n = int(head[1:colon])
            start = pos + colon + 1
            if index in wanted:
                raw = part(start, min(n, shown))
                values[index] = sqlite_text_factory(raw) if head[0] == _T else raw
            pos = start + n
        else:
            comma = head.index(_COMMA)
            values[index] = parse_sql_literal(head[:comma].decode("ascii"))
            pos += comma + 1
    return [values[i] for i in wanted]
