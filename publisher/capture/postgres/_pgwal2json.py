"""wal2json (format version 2) messages -> the capture event model of ``_pgoutput``.

Options capture starts wal2json with (:data:`WAL2JSON_OPTIONS`) make every message a
JSON object with an ``action``::

    B  {"lsn": commit LSN, "nextlsn": end LSN, "timestamp": commit time,
        "origin": the transaction's replication origin id (0: none)}
    C  the same fields as B
    I  {"schema", "table", "columns": [{"name", "type", "typeoid", "value"}, ...]}
    U  as I, plus "identity": the old row (all columns under REPLICA IDENTITY FULL);
       unchanged TOASTed columns are left out of "columns"
    D  {"schema", "table", "identity"}
    T  {"schema", "table"}
    M  {"transactional", "prefix", "content"}: a logical message (only transactional
       ones are kept: procedure call marks, common/calls.py)

wal2json has no relation messages: the adapter keeps each table's column list (names,
type OIDs, declared types) and emits a :class:`Relation` with a stable per-table OID
whenever it changes, so schema changes are detected the same way as with pgoutput.
wal2json names a transaction's replication origin by its id (``include-origin``); the
adapter asks ``origin_name`` for its name (``pg_replication_origin.roname``) and emits
an :class:`Origin` after the Begin, as pgoutput does (common/origin.py, R2).
Numbers are kept as the literal text wal2json wrote (numeric keeps its scale), booleans
become ``t``/``f`` and bytea gets its ``\\x`` prefix back: values then parse exactly as
pgoutput's text output.  wal2json (2.5, without ``numeric-data-types-as-string``) writes a
numeric, real or double precision NaN or +-Infinity as JSON ``null``, which cannot be told
from NULL: capture refuses such columns under wal2json when the table is added
(:data:`LOSSY_TYPES`).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

from publisher.capture.postgres._pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    Datum,
    Delete,
    Event,
    Insert,
    Message,
    Origin,
    ProtocolError,
    Relation,
    RelColumn,
    Truncate,
    Update,
)

__all__ = ["LOSSY_TYPES", "WAL2JSON_OPTIONS", "OriginNames", "Wal2JsonDecoder"]

# Types (as a target spells them, typmod left out) whose NaN and +-Infinity wal2json
# writes as null.  Arrays are not affected: they travel as their text output.
LOSSY_TYPES: Final = frozenset({"numeric", "real", "double precision"})

WAL2JSON_OPTIONS: Final = {
    "format-version": "2",
    "include-lsn": "1",
    "include-timestamp": "1",
    "include-type-oids": "1",
    "include-typmod": "1",
    "include-origin": "1",
    "filter-tables": "_txrepl.*",
}

_NUMERIC_MOD = re.compile(r"^numeric\((\d+)(?:,(\d+))?\)$")


def _lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _time_us(text: str) -> int:
    ts = dt.datetime.fromisoformat(text)
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    delta = ts - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# Types (and their arrays) whose typmod is the one number wal2json prints after the
# name: char(n)/varchar(n) store n + 4, bit(n)/varbit(n) and the time types' precision n.
_LENGTH_MOD: Final = {1042: 4, 1014: 4, 1043: 4, 1015: 4}
_PLAIN_MOD: Final = frozenset(
    {1560, 1561, 1562, 1563, 1083, 1183, 1266, 1270, 1114, 1115, 1184, 1185}
)
_ONE_MOD = re.compile(r"[^(]*\((\d+)\)")


def _typmod(type_oid: int, type_name: str) -> int:
    """The typmod the catalog has for a column wal2json names ``type_name`` (a relation
    message gives it; without it, ``varchar(20)`` would read as ``varchar`` and differ
    from the catalog's shape, which the copy after a type change compares with)."""
    if type_oid == 1700:
        m = _NUMERIC_MOD.match(type_name)
        if m:
            return ((int(m.group(1)) << 16) | int(m.group(2) or 0)) + 4
    if type_oid in _LENGTH_MOD or type_oid in _PLAIN_MOD:
        one = _ONE_MOD.match(type_name)
        if one:
            return int(one.group(1)) + _LENGTH_MOD.get(type_oid, 0)
    return -1


def _datum(v: Any, type_oid: int) -> Datum:
    if v is None:
        return None
    if isinstance(v, bool):
        return "t" if v else "f"
    if not isinstance(v, str):
        raise ProtocolError(f"unexpected wal2json value {v!r}")
    if type_oid == 17 and not v.startswith("\\x"):
        return "\\x" + v
    return v


class OriginNames:
    """Replication origin names by id, read from the source's ``pg_replication_origin``
    on the capture's admin connection (cached: txrepl never drops an origin)."""

    def __init__(self, admin: Callable[[], Any], lock: threading.Lock) -> None:
        self._admin = admin
        self._lock = lock
        self._names: dict[int, str] = {}

    def __call__(self, ident: int) -> str:
        name = self._names.get(ident)
        if name is None:
            conn = self._admin()
            with self._lock:
                row = conn.execute(
                    "SELECT roname FROM pg_replication_origin WHERE roident = %s", (ident,)
                ).fetchone()
            name = str(row[0]) if row else ""
            if name:
                self._names[ident] = name
        return name


class Wal2JsonDecoder:
    """Stateful: remembers each table's columns to synthesise relation messages."""

    def __init__(self, origin_name: Callable[[int], str] | None = None) -> None:
        self._tables: dict[tuple[str, str], Relation] = {}
        self._next_oid = 1
        self._origin_name = origin_name  # a replication origin's name by its id

    def decode(self, payload: bytes) -> Iterator[Event]:
        try:
            # parse_float/parse_int keep numbers as the literal text: 12.30 stays "12.30".
            msg = json.loads(payload, parse_float=str, parse_int=str)
        except ValueError as e:
            raise ProtocolError(f"malformed wal2json message: {e}") from e
        action = msg.get("action")
        if action == "B":
            yield Begin(_lsn(msg["lsn"]), _time_us(msg["timestamp"]), int(msg.get("xid", 0)))
            origin = int(msg.get("origin") or 0)
            if origin and self._origin_name is not None:
                yield Origin(self._origin_name(origin))
        elif action == "C":
            yield Commit(_lsn(msg["lsn"]), _lsn(msg["nextlsn"]), _time_us(msg["timestamp"]))
        elif action in ("I", "U", "D"):
            key = (msg["schema"], msg["table"])
            new_cols = msg.get("columns") or []
            old_cols = msg.get("identity") or []
            # The column list: the old row's under FULL identity (complete, while the new
            # row omits unchanged TOAST), else the new row's.
            shape = old_cols if old_cols else new_cols
            rel, changed = self._relation(key, shape)
            if changed:
                yield rel
            names = [c.name for c in rel.columns]
            oids = [c.type_oid for c in rel.columns]
            old = self._row(names, oids, old_cols) if old_cols else None
            if action == "I":
                yield Insert(rel.oid, self._row(names, oids, new_cols))
            elif action == "U":
                yield Update(rel.oid, old, self._row(names, oids, new_cols))
            else:
                if old is None:
                    raise ProtocolError("wal2json delete without identity")
                yield Delete(rel.oid, old)
        elif action == "T":
            key = (msg["schema"], msg["table"])
            known = self._tables.get(key)
            if known is None:
                known, _ = self._relation(key, [])
                yield known
            yield Truncate((known.oid,), cascade=False, restart_identity=False)
        elif action == "M":  # a logical message: the DDL watch's (``_ddlwatch.py``)
            content = msg.get("content") or ""
            yield Message(
                bool(msg.get("transactional")), str(msg.get("prefix", "")), content.encode()
            )
        else:
            raise ProtocolError(f"unknown wal2json action {action!r}")

    def _relation(self, key: tuple[str, str], cols: list[dict[str, Any]]) -> tuple[Relation, bool]:
        shape = tuple(
            RelColumn(
                c["name"],
                int(c["typeoid"]),
                _typmod(int(c["typeoid"]), c["type"]),
                type_name=c["type"],
            )
            for c in cols
        )
        rel = self._tables.get(key)
        if rel is not None and (rel.columns == shape or not shape):
            return rel, False
        oid = rel.oid if rel is not None else self._next_oid
        if rel is None:
            self._next_oid += 1
        rel = Relation(oid, key[0], key[1], "f", shape)
        self._tables[key] = rel
        return rel, True

    @staticmethod
    def _row(names: list[str], oids: list[int], cols: list[dict[str, Any]]) -> tuple[Datum, ...]:
        by_name = {c["name"]: c["value"] for c in cols}
        return tuple(
            _datum(by_name[n], oid) if n in by_name else UNCHANGED
            for n, oid in zip(names, oids, strict=True)
        )
