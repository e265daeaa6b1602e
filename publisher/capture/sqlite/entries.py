"""Captured rows into log entries: the ops of one publication, cut to a size.

:class:`EntryBuilder` is the half of :class:`~publisher.capture.sqlite.SqliteCapture`
that turns the rows of ``_txrepl_capture`` (capture.py draws the table) read in one
poll into the entries of one publication.  The rules, in the order a row meets them:

* a row at or below ``after_id`` is already in the publication's log: skipped;
* ``'C'`` (a call the publication records, publisher/capture/calls.py) becomes a
  call op, whatever its table;
* a row of a table the publication does not hold, or with an id below the table's
  ``added_id`` (captured before the table was added), or tagged for another
  publication (``pub``: a snapshot's copy), is not for it;
* ``'S'`` carries the table's schema as it was built (a generation of
  ``_txrepl_shapes``); a row of a generation whose schema this publication's log
  has not been given since this process started is preceded by that schema, so a
  restart repeats the schema once rather than ever leaving it out (``_logged``,
  reset by :meth:`SqliteCapture.forget` when an entry was not logged);
* a row change becomes a row op, its packed images decoded (images.py) and its
  values encoded with their storage class (exact.py), written as wire bytes (wire.py).

With ``max_bytes`` an entry ends before the op that would take it over the limit,
so a poll's transactions may span several entries, and one op alone over the limit
is :class:`~publisher.errors.RowTooLarge`, naming its table and key (read piece by
piece from SQLite when the row itself is too large to read).  Every entry of a
poll records the last row id as its ``source_position``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from common.calls import parse_call
from common.names import format_table
from common.rpc import txrepl_pb2 as pb
from publisher.capture.protowire import framed
from publisher.capture.sqlite.constraints import published
from publisher.capture.sqlite.images import image_values_at
from publisher.capture.sqlite.wire import image_fields, row_op, table_field
from publisher.errors import RowTooLarge, key_text

__all__ = ["CapturedRow", "EntryBuilder", "Shape"]


class CapturedRow(NamedTuple):
    """One row of ``_txrepl_capture`` as read (a tuple: built in C from the cursor's
    row, about 2 us per row less than a frozen dataclass in a backlog's hot loop)."""

    id: int
    pub: str | None
    tbl: str
    op: str
    k: object
    v: object
    gen: int | None = None  # None: captured by a build older than generations
    size: int = 0  # bytes of k and v as stored (either may be left unread: read())
    origin: str | None = None  # applied by txrepl from this node (common/origin.py); None: local


class EntryBuilder:
    """``build_entry`` and ``build_entries`` of :class:`SqliteCapture`."""

    _conn: sqlite3.Connection
    # (publication, table) -> the generation whose schema op the log has last seen
    _logged: dict[tuple[str, str], int | None]

    def _shape(self, gen: int | None, table: str) -> Shape:
        raise NotImplementedError

    def build_entry(
        self,
        publication: str,
        rows: Iterable[CapturedRow],
        after_id: int,
        tables: Mapping[str, int],
    ) -> tuple[pb.Entry | None, int]:
        """Ops of ``rows`` that belong to ``publication`` as one entry (no size limit)."""
        entries, last = self.build_entries(publication, rows, after_id, tables)
        return (entries[0] if entries else None), last

    def build_entries(
        self,
        publication: str,
        rows: Iterable[CapturedRow],
        after_id: int,
        tables: Mapping[str, int],
        max_bytes: int | None = None,
    ) -> tuple[list[pb.Entry], int]:
        """Ops of ``rows`` that belong to ``publication``; returns (entries, last id).

        With ``max_bytes``, each entry's ops stay within it (a new entry starts
        when the next op would not fit) and a row change alone over it raises
        :class:`RowTooLarge`, naming its table and key.  A row of a generation
        whose schema this publication's log has not seen (since this process
        started) is preceded by that schema (shapes.py).
        """
        pieces, last = self.build_framed(publication, rows, after_id, tables, max_bytes)
        entries = [pb.Entry.FromString(ops) for ops in pieces]
        now = int(time.time() * 1_000_000)
        for e in entries:
            e.commit_time_us = now
            e.source_position = str(last)
        return entries, last

    def build_framed(
        self,
        publication: str,
        rows: Iterable[CapturedRow],
        after_id: int,
        tables: Mapping[str, int],
        max_bytes: int | None = None,
    ) -> tuple[list[bytes], int]:
        """:meth:`build_entries`, each entry as the bytes of its ``ops`` field (what
        ``Publication.append_encoded`` logs around them, without a parse)."""
        limit = max_bytes if max_bytes is not None else 2**62
        entries: list[bytes] = []
        parts: list[bytes] = []  # the open entry's serialized ops (wire.py)
        size = 0
        last = after_id
        logged = self._logged
        # (generation, table) -> its shape and the wire's table field, for the rows whose
        # schema op the log has had: the per-row checks done once per shape
        ready: dict[tuple[int | None, str], tuple[Shape, bytes]] = {}

        def room(op: bytes, key_idx: Sequence[int] = ()) -> None:
            nonlocal parts, size
            n = len(op) + 6  # the op's tag and length
            if n > limit:
                parsed = pb.Op.FromString(op)
                raise RowTooLarge(
                    publication=publication,
                    table=parsed.row.table or parsed.schema.table,
                    key=key_text(parsed.row, key_idx),
                    size=n,
                    limit=limit,
                )
            if size + n > limit and parts:
                entries.append(framed(parts))
                parts, size = [], 0
            parts.append(op)
            size += n

        for r in rows:
            if r.id <= after_id:
                continue
            last = r.id
            if r.op == "C":  # a call this publication records (publisher/capture/calls.py)
                room(pb.Op(call=parse_call(r.v)).SerializeToString())  # type: ignore[arg-type]
                continue
            tbl = r.tbl
            added = tables.get(tbl)
            if added is None or r.id < added:
                continue
            if r.pub is not None and r.pub != publication:
                continue
            if r.op == "S":
                assert isinstance(r.v, bytes)
                op = pb.Op()
                op.schema.MergeFromString(r.v)
                op.schema.table = format_table(None, tbl)
                room(published(op, tables).SerializeToString())
                logged[(publication, tbl)] = r.gen
                ready.clear()
                continue
            known = ready.get((r.gen, tbl))
            if known is None:  # a shape not met yet in this call, or whose schema op is due
                shape = self._shape(r.gen, tbl)
                if logged.get((publication, tbl), _NONE) != r.gen:
                    op = pb.Op()
                    op.schema.CopyFrom(shape.schema)
                    op.schema.table = format_table(None, tbl)
                    room(published(op, tables).SerializeToString())
                    logged[(publication, tbl)] = r.gen
                    ready.clear()  # another generation of tbl needs its schema again
                wire_name = table_field(format_table(None, tbl).encode())  # common/names.py
                known = ready[(r.gen, tbl)] = (shape, wire_name)
            shape, wire_name = known
            if r.size > limit:
                raise RowTooLarge(
                    publication=publication,
                    table=tbl,
                    key=self._large_key(r, shape),
                    size=r.size,
                    limit=limit,
                )
            op_bytes = row_op(  # wire.py: the bytes pb.Value objects would serialize to
                wire_name,
                _OPS[r.op],
                None if r.k is None else image_fields(r.k, shape.key_types, b"\x1a"),
                None if r.v is None else image_fields(r.v, shape.types, b"\x22"),
            )
            n = len(op_bytes) + 6
            if size + n <= limit:  # room(), inline: most ops fit
                parts.append(op_bytes)
                size += n
            else:
                room(op_bytes, shape.key_idx)
        if parts:
            entries.append(framed(parts))
        return entries, last

    def _large_key(self, r: CapturedRow, shape: Shape) -> str:
        """The key of a row too large to read, read piece by piece from SQLite."""
        if not shape.key_idx:
            return "(no key)"
        col = "k" if r.op in ("U", "D") else "v"
        at = shape.key_idx if col == "v" else list(range(len(shape.key_idx)))
        values = image_values_at(self._conn, r.id, col, at)
        shown = (f"{k}={x!r:.60}" for k, x in zip(shape.schema.primary_key, values, strict=False))
        return "(" + ", ".join(shown) + ")"


_NONE = object()  # no generation logged yet (a generation may be None)

_OPS = {
    "I": int(pb.ROW_OP_INSERT),
    "U": int(pb.ROW_OP_UPDATE),
    "D": int(pb.ROW_OP_DELETE),
    "T": int(pb.ROW_OP_TRUNCATE),
}


@dataclass(frozen=True, slots=True)
class Shape:
    """One generation's schema and the (type, scale) of its values and key."""

    schema: pb.TableSchema
    types: list[tuple[int, int]]
    key_types: list[tuple[int, int]]
    key_idx: list[int]

    @classmethod
    def of(cls, schema: pb.TableSchema) -> Shape:
        by_name = {c.name: (int(c.type), c.scale) for c in schema.columns}
        names = [c.name for c in schema.columns]
        return cls(
            schema,
            [(int(c.type), c.scale) for c in schema.columns],
            [by_name[k] for k in schema.primary_key],
            [names.index(k) for k in schema.primary_key],
        )
