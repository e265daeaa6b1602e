"""The SQL a conflict guard needs, per dialect: placeholders, names, catalogs, tables.

The guard (``_guard.py``) runs on the writer's own connection (a ``sqlite3``
connection, or a psycopg cursor), inside the batch's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.names import parse_table, quote_ident
from subscriber.targets.conflicts._model import jsonable

__all__ = ["ConflictSql", "pg_json", "postgres_sql", "sqlite_sql"]

_LOG_COLUMNS = """
    subscription   TEXT NOT NULL,
    seq            BIGINT NOT NULL,       -- the publisher's entry
    table_name     TEXT NOT NULL,
    kind           TEXT NOT NULL,         -- insert_exists, update_missing, ...
    row_key        TEXT NOT NULL,         -- JSON {column: value}
    publisher_row  TEXT,                  -- JSON; NULL: the publisher deleted the row
    local_row      TEXT,                  -- JSON; NULL: the target had no row
    applied_row    TEXT,                  -- JSON; what the target holds after it
    resolver       TEXT NOT NULL,
    decision       TEXT NOT NULL,         -- take_publisher, ignore, apply, republish
    commit_time_us BIGINT NOT NULL,       -- the publisher's commit time
    created_at     TEXT NOT NULL          -- when it was resolved (UTC, ISO 8601)
"""

_VERSIONS = """
CREATE TABLE IF NOT EXISTS txrepl_row_versions (
    subscription TEXT NOT NULL,
    table_name   TEXT NOT NULL,
    row_key      TEXT NOT NULL,
    row_hash     TEXT NOT NULL,   -- the row as last replicated (sha1 of its JSON)
    PRIMARY KEY (subscription, table_name, row_key)
)"""


@dataclass(frozen=True)
class ConflictSql:
    name: str
    mark: str  # a placeholder
    table: Callable[[str], str]  # a wire table name as SQL
    bind: Callable[[object], object]  # a common.values value as the driver binds it
    run: Callable[[Any, str, Sequence[object]], list[tuple[Any, ...]]]
    # one statement, many parameter rows: each one's result rows (PostgreSQL: one
    # pipelined round trip, not one per row)
    run_many: Callable[[Any, str, Sequence[Sequence[object]]], list[list[tuple[Any, ...]]]]
    ddl: tuple[str, ...]
    local_begin: tuple[str, ...]  # around a republished write: it is a local change
    local_end: tuple[str, ...]
    unique_keys: Callable[[Any, str], list[list[str]]]
    evaluate: Callable[[Any, str, str, dict[str, Any], dict[str, Any]], object]
    # republished rows are written after the batch commits, in a transaction of their
    # own (PostgreSQL, whose replication origin marks whole transactions: _republish.py)
    republish_after: bool = False
    # appended to the read of the target's rows: PostgreSQL locks them for the batch's
    # transaction, so an application's write cannot land between the check and the
    # apply's write (it waits, then changes the row the apply left: a local change,
    # published as such).  SQLite's BEGIN IMMEDIATE already holds the database.
    lock_rows: str = ""


def _sqlite_run(conn: Any, text: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
    return list(conn.execute(text, tuple(params)).fetchall())


def _sqlite_run_many(
    conn: Any, text: str, params: Sequence[Sequence[object]]
) -> list[list[tuple[Any, ...]]]:
    return [list(conn.execute(text, tuple(p)).fetchall()) for p in params]


def _sqlite_unique(conn: Any, table: str) -> list[list[str]]:
    out = []
    for _, name, unique, origin, partial in conn.execute(f"PRAGMA index_list({table})"):
        if unique and origin != "pk" and not partial:
            cols = [r[2] for r in conn.execute(f"PRAGMA index_info({quote_ident(name)})")]
            if cols and None not in cols:
                out.append(cols)
    return out


def sqlite_sql(bind: Callable[[object], object]) -> ConflictSql:
    def table(name: str) -> str:
        return quote_ident(parse_table(name).flat)

    def evaluate(
        conn: Any, tbl: str, expr: str, pub: dict[str, Any], loc: dict[str, Any]
    ) -> object:
        cols = ", ".join(quote_ident(c) for c in pub)
        marks = ", ".join("?" for _ in pub)
        text = (
            f"WITH pub({cols}) AS (VALUES ({marks})), loc({cols}) AS (VALUES ({marks})) "
            f"SELECT ({expr}) FROM pub, loc"
        )
        params = [bind(v) for v in pub.values()] + [bind(loc.get(c)) for c in pub]
        return conn.execute(text, params).fetchone()[0]

    return ConflictSql(
        name="sqlite",
        mark="?",
        table=table,
        bind=bind,
        run=_sqlite_run,
        run_many=_sqlite_run_many,
        ddl=(
            "CREATE TABLE IF NOT EXISTS txrepl_conflicts ("
            "id INTEGER PRIMARY KEY AUTOINCREMENT," + _LOG_COLUMNS + ")",
            _VERSIONS,
        ),
        # The marker row (with the batch's origin: common/origin.py) is set aside
        # while the republished row is written, then put back as it was.
        local_begin=(
            "CREATE TEMP TABLE IF NOT EXISTS txrepl_applying_aside AS"
            " SELECT * FROM txrepl_applying WHERE 0",
            "DELETE FROM temp.txrepl_applying_aside",
            "INSERT INTO temp.txrepl_applying_aside SELECT * FROM txrepl_applying",
            "DELETE FROM txrepl_applying",
        ),
        local_end=("INSERT INTO txrepl_applying SELECT * FROM temp.txrepl_applying_aside",),
        unique_keys=lambda conn, t: _sqlite_unique(conn, table(t)),
        evaluate=evaluate,
    )


REPUBLISH_DDL = """
CREATE TABLE IF NOT EXISTS txrepl_republish (
    id           BIGSERIAL PRIMARY KEY,
    subscription TEXT NOT NULL,
    table_name   TEXT NOT NULL,
    row_key      JSONB NOT NULL,   -- {column: value}
    version_key  TEXT NOT NULL,    -- the key as txrepl_row_versions names it
    "row"        JSONB,            -- the resolver's row; NULL: delete the key
    columns      JSONB NOT NULL,   -- the table's replicated columns
    expect       TEXT NOT NULL     -- the key's version as the batch left it
)"""  # PostgreSQL's republished rows between their two transactions (_republish.py)


def _pg_run(cur: Any, text: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
    cur.execute(text, tuple(params))
    return list(cur.fetchall()) if cur.description else []


def _pg_run_many(
    cur: Any, text: str, params: Sequence[Sequence[object]]
) -> list[list[tuple[Any, ...]]]:
    if not params:
        return []
    cur.executemany(text, [tuple(p) for p in params], returning=True)
    out = []
    while True:
        out.append(list(cur.fetchall()) if cur.description else [])
        if not cur.nextset():
            return out


_PG_UNIQUE = """
SELECT array_agg(a.attname::text ORDER BY k.n)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s::regclass AND i.indisunique AND NOT i.indisprimary
  AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid
"""


def pg_json(row: dict[str, Any]) -> str:
    """A row as JSON that ``jsonb_populate_record`` reads back (bytes as ``\\x`` hex)."""

    def cell(v: Any) -> Any:
        if isinstance(v, bytes | bytearray | memoryview):
            return "\\x" + bytes(v).hex()
        return jsonable(v)

    return json.dumps({k: cell(v) for k, v in row.items()}, default=jsonable)


def postgres_sql(replication_role: str = "replica") -> ConflictSql:
    def table(name: str) -> str:
        ref = parse_table(name)
        if ref.schema is None:
            return quote_ident(ref.name)
        return f"{quote_ident(ref.schema)}.{quote_ident(ref.name)}"

    def evaluate(cur: Any, tbl: str, expr: str, pub: dict[str, Any], loc: dict[str, Any]) -> object:
        t = table(tbl)
        text = (
            f"SELECT ({expr.replace('%', '%%')}) FROM jsonb_populate_record(NULL::{t}, "
            f"%s::jsonb) AS pub, jsonb_populate_record(NULL::{t}, %s::jsonb) AS loc"
        )
        cur.execute(text, (pg_json(pub), pg_json(loc)))
        return cur.fetchone()[0]

    return ConflictSql(
        name="postgresql",
        lock_rows=" FOR UPDATE",
        mark="%s",
        table=table,
        bind=lambda v: v,
        run=_pg_run,
        run_many=_pg_run_many,
        ddl=(
            "SELECT pg_advisory_xact_lock(hashtext('txrepl conflicts'))",
            "CREATE TABLE IF NOT EXISTS txrepl_conflicts (id BIGSERIAL PRIMARY KEY,"
            + _LOG_COLUMNS
            + ")",
            _VERSIONS,
            REPUBLISH_DDL,
        ),
        local_begin=("SELECT set_config('session_replication_role', 'origin', true)",),
        local_end=(f"SELECT set_config('session_replication_role', '{replication_role}', true)",),
        unique_keys=lambda cur, t: [list(r[0]) for r in _pg_run(cur, _PG_UNIQUE, (table(t),))],
        evaluate=evaluate,
        republish_after=True,
    )
