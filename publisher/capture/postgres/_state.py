"""Run-time state of PostgreSQL capture: installed tables, open transactions, marks.

Plain values shared by the capture core (``_core.py``) and the streaming session
(``_session.py``); LSNs are ints here, formatted ``X/X`` only for people.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from common.rpc import txrepl_pb2 as pb
from publisher.capture.calls import CallScope
from publisher.capture.groups import GroupWriter
from publisher.capture.postgres._pgcatalog import TableName, TableShape
from publisher.capture.postgres._pgoutput import Relation
from publisher.capture.postgres._pgwire import RowWriter
from publisher.publication import Publication

__all__ = [
    "Mark",
    "PendingSnapshot",
    "PubState",
    "RelState",
    "TableState",
    "Txn",
    "format_lsn",
    "parse_lsn",
    "redact",
    "slot_ok",
]


def redact(dsn: str) -> str:
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    params.pop("password", None)
    return make_conninfo("", **params)


def slot_ok(slot: str) -> bool:
    return 0 < len(slot) <= 63 and all(c.islower() or c.isdigit() or c == "_" for c in slot)


@dataclass(slots=True)
class TableState:
    """One installed table of one publication, at run time."""

    name: TableName
    snapshot_lsn: int | None
    complete: bool
    logged: pb.TableSchema | None  # the schema last logged in the publication
    recopy: bool = False  # a copy of the table is wanted after a schema change (_evolve)
    # The schema ``for_publication`` gave for ``seen`` (a relation's shape), while it is
    # the one logged: a row of the same shape then needs no comparison (_session._ops).
    seen: TableShape | None = None
    seen_schema: pb.TableSchema | None = None


@dataclass(slots=True)
class PubState:
    pub: Publication
    tables: dict[str, TableState] = field(default_factory=dict)  # by display name


@dataclass(slots=True)
class RelState:
    name: TableName
    rel: Relation
    shape: TableShape | None = None  # resolved on first use
    writer: RowWriter | None = None  # its rows' wire bytes (_pgwire.py), with the shape
    display: str = ""  # ``name.display``, made once rather than per row

    def __post_init__(self) -> None:
        self.display = self.name.display


@dataclass(slots=True)
class Txn:
    final_lsn: int
    commit_time_us: int
    ops: dict[str, list[bytes]] = field(default_factory=dict)  # serialized Ops (_pgwire.py)
    logged: list[tuple[str, str, pb.TableSchema]] = field(default_factory=list)
    # Per publication: bytes of ``ops``, and the group its earlier fragments went to
    # (a transaction over max_entry_bytes: publisher/capture/groups.py).
    sizes: dict[str, int] = field(default_factory=dict)
    groups: dict[str, GroupWriter] = field(default_factory=dict)
    recopy: list[tuple[str, str]] = field(default_factory=list)  # (publication, table)
    origin: str = ""  # the node txrepl's apply applied it from; "": the source's own
    # Per publication: the tables it inserted into (their sequences: _sequences.py).
    inserted: dict[str, dict[TableName, None]] = field(default_factory=dict)
    calls: dict[str, CallScope] = field(default_factory=dict)  # per publication (calls.py)


@dataclass(slots=True)
class PendingSnapshot:
    lsn: int
    snapshot: str
    conn: Any  # psycopg2 replication connection holding the temporary slot
    tables: dict[str, list[str]]  # publication -> display names


@dataclass(slots=True)
class Mark:
    lsn: int
    done: threading.Event = field(default_factory=threading.Event)
    heads: dict[str, int] = field(default_factory=dict)


def parse_lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
