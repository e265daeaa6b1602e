"""Conflict detection, resolution and the conflict log of updatable subscriptions.

``_guard.py`` (the hard part: detection and resolution inside a batch's
transaction, its docstring has the table of conflicts), ``_model.py`` (what a
resolver sees and returns, the built-in resolvers), ``_sql.py`` (each dialect's SQL),
:func:`read_conflicts` (the log, read on its own connection: ``txrepl subscriber
conflicts``).  Configuration: ``subscriber.conflictspec``; docs/conflicts.md.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.dburl import DatabaseUrl
from subscriber.apply.errors import WriterError
from subscriber.conflictspec import parse_resolver
from subscriber.targets.conflicts._guard import ConflictGuard, ConflictPolicy
from subscriber.targets.conflicts._model import KINDS, Conflict, Resolution
from subscriber.targets.conflicts._sql import ConflictSql, postgres_sql, sqlite_sql

__all__ = [
    "KINDS",
    "Conflict",
    "ConflictGuard",
    "ConflictPolicy",
    "ConflictRecord",
    "ConflictSql",
    "Resolution",
    "conflict_counts",
    "guarded_rows",
    "policies_of",
    "postgres_sql",
    "read_conflicts",
    "sqlite_sql",
]


def policies_of(subscriptions: Any) -> dict[str, ConflictPolicy]:
    """The updatable subscriptions of a config (``SubscriptionConfig`` list), by id."""
    out = {}
    for sc in subscriptions:
        if not sc.conflicts:
            continue
        tables = {
            t: None if text == "off" else parse_resolver(text, field=f"conflict_tables.{t}")
            for t, text in sc.conflict_tables.items()
        }
        out[sc.id] = ConflictPolicy(
            parse_resolver(sc.conflicts, field="conflicts"),
            tables,
            sc.conflict_time_column,
            pair=sc.conflict_pair,
        )
    return out


@dataclass(frozen=True)
class ConflictRecord:
    """One row of the target's ``txrepl_conflicts``."""

    id: int
    subscription: str
    seq: int
    table_name: str
    kind: str
    row_key: str
    publisher_row: str | None
    local_row: str | None
    applied_row: str | None
    resolver: str
    decision: str
    commit_time_us: int
    created_at: str


_COLUMNS = (
    "id, subscription, seq, table_name, kind, row_key, publisher_row, local_row, "
    "applied_row, resolver, decision, commit_time_us, created_at"
)


def read_conflicts(
    url: DatabaseUrl, subscription: str | None = None, table: str | None = None
) -> list[ConflictRecord]:
    """The conflict log of the target ``url`` (empty if it has none), oldest first."""
    where, params = [], []
    for col, value in (("subscription", subscription), ("table_name", table)):
        if value is not None:
            where.append(f"{col} = {{m}}")
            params.append(value)
    text = f"SELECT {_COLUMNS} FROM txrepl_conflicts"
    if where:
        text += " WHERE " + " AND ".join(where)
    text += " ORDER BY id"
    rows: list[Any]
    if url.dialect == "sqlite":
        if not url.sqlite_path.is_file():
            raise WriterError(f"target {url.sqlite_path} does not exist (check target =)")
        try:
            conn = sqlite3.connect(f"file:{url.sqlite_path}?mode=ro", uri=True)
            try:
                have = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'txrepl_conflicts'"
                ).fetchall()
                rows = conn.execute(text.format(m="?"), params).fetchall() if have else []
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise WriterError(f"cannot read the conflict log of {url.sqlite_path}: {exc}") from exc
    else:
        import psycopg

        try:
            with psycopg.connect(url.raw, connect_timeout=10) as pg:
                found = pg.execute("SELECT to_regclass('txrepl_conflicts')").fetchone()
                ok = found is not None and found[0] is not None
                rows = pg.execute(text.format(m="%s"), params).fetchall() if ok else []
        except psycopg.Error as exc:
            host = url.raw.rsplit("@", 1)[-1]
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WriterError(f"cannot read the conflict log of {host}: {first}") from exc
    return [ConflictRecord(*r) for r in rows]


def conflict_counts(records: list[ConflictRecord]) -> Mapping[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for r in records:
        out[(r.subscription, r.table_name)] = out.get((r.subscription, r.table_name), 0) + 1
    return out


def guarded_rows(
    guard: ConflictGuard | None, conn: Any, subscription: str, step: Any, write: Any
) -> int:
    """``write(step)`` for a writer's rows step, with ``guard``'s checks around it when
    the step's table is checked for ``subscription`` (a writer's one hook)."""
    if guard is None or guard.spec(subscription, step.schema.table) is None:
        return int(write(step))
    resolved, pending = guard.resolve(conn, subscription, step)
    written = int(write(resolved))
    guard.finish(conn, subscription, pending)
    return written
