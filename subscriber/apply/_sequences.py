"""Sequence positions of a batch's entries, handed to a writer that keeps them.

A PostgreSQL source writes its sequences' positions into the entries
(``Entry.sequences``: publisher/capture/postgres/_sequences.py has when and why).
Before each write, the engine gives the writer the highest position per (table,
column) among the entries of that write, as its ``sequence_positions``; a writer
without that attribute (SQLite, MariaDB) is given nothing and nothing is parsed.
Positions only move sequences up, so a write that carries positions of entries it
ends up not applying (a narrowed batch) only leaves a target ahead: never a used id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.fragments import mark
from subscriber.apply.entry import AnyEntry, RawEntry

__all__ = ["hand_positions"]


def hand_positions(writer: Any, entries: Sequence[AnyEntry]) -> None:
    """Set ``writer.sequence_positions`` to the highest position per (table, column)."""
    if not hasattr(writer, "sequence_positions"):
        return
    top: dict[tuple[str, str], int] = {}
    for entry in entries:
        found = mark(entry.payload).sequences if isinstance(entry, RawEntry) else entry.sequences
        for p in found:
            at = (p.table, p.column)
            if p.last_value > top.get(at, p.last_value - 1):
                top[at] = p.last_value
    writer.sequence_positions = top
