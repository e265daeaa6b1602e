"""pgoutput messages built by hand, for tests of the parser and the capture's hot path."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from publisher.capture.postgres._pgoutput import UNCHANGED

__all__ = ["tuple_data"]


def tuple_data(cells: Iterable[object]) -> bytes:
    """A TupleData: 'n' for None, 'u' for UNCHANGED, 'b' for bytes, else 't' (str())."""
    cells = list(cells)
    out = struct.pack(">h", len(cells))
    for c in cells:
        if c is None:
            out += b"n"
        elif c is UNCHANGED:
            out += b"u"
        elif isinstance(c, bytes):
            out += b"b" + struct.pack(">i", len(c)) + c
        else:
            data = str(c).encode()
            out += b"t" + struct.pack(">i", len(data)) + data
    return out
