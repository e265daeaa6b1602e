"""PostgreSQL -> PostgreSQL (issue 19): the target's identity and serial sequences
follow the rows the publisher sends, so a target promoted to take writes hands out
ids the source did not use (real daemons, real private instances)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import Pair
from tests.support.phases import settle

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

DDL = [
    "CREATE TABLE items (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text)",
    "CREATE TABLE notes (id serial PRIMARY KEY, body text)",
]


def _work(conn: psycopg.Connection[Any], start: int, n: int) -> None:
    for i in range(start, start + n):
        with conn.transaction():
            conn.execute("INSERT INTO items (name) VALUES (%s)", (f"item {i}",))
            conn.execute("INSERT INTO notes (body) VALUES (%s)", (f"note {i}",))
            if i % 4 == 0:  # deletes, never of the newest row
                conn.execute("DELETE FROM items WHERE id = (SELECT min(id) FROM items)")


def _differences(src: psycopg.Connection[Any], dst_dsn: str, query: str) -> list[str]:
    """``query``'s row on the source and the target, if they differ."""
    want = src.execute(query).fetchone()
    with psycopg.connect(dst_dsn, autocommit=True) as dst:
        have = dst.execute(query).fetchone()
    return [] if have == want else [f"source {want}, target {have}"]


def _pair(tmp_path: Path, tables: list[str], src_dsn: str, dst_dsn: str) -> Pair:
    return Pair(
        tmp_path,
        tables=tables,
        source_url=src_dsn,
        target_url=dst_dsn,
        publisher_extra={"slot": "txrepl_" + dst_dsn.rsplit("/", 1)[-1]},
    )


def test_a_promoted_target_hands_out_ids_past_the_replicated_ones(
    tmp_path: Path, pg_server: Any
) -> None:
    """Into tables the operator created with the source's DDL (an identity ALWAYS key,
    a serial key): after a backlog in one batch and live small batches, an INSERT on
    the target that lets the sequence choose gets an id above every replicated one,
    instead of failing on a duplicate key."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    src = psycopg.connect(src_dsn, autocommit=True)
    with psycopg.connect(dst_dsn, autocommit=True) as dst:
        for stmt in DDL:
            src.execute(stmt)
            dst.execute(stmt)
    _work(src, 0, 10)  # present when the tables are added
    pair = _pair(tmp_path, ["items", "notes"], src_dsn, dst_dsn)
    query = "SELECT (SELECT max(id) FROM items), (SELECT max(id) FROM notes)"

    try:
        pair.start_publisher()
        _work(src, 10, 40)  # a backlog before the subscriber exists
        pair.start_subscriber()
        settle(pair, lambda: _differences(src, dst_dsn, query))
        for i in range(50, 60):  # live: small batches
            _work(src, i, 1)
        settle(pair, lambda: _differences(src, dst_dsn, query))
        top = src.execute(query).fetchone()
    finally:
        pair.stop()
        src.close()
    with psycopg.connect(dst_dsn, autocommit=True) as dst:  # promoted: it takes writes
        item = dst.execute("INSERT INTO items (name) VALUES ('local') RETURNING id").fetchone()
        note = dst.execute("INSERT INTO notes (body) VALUES ('local') RETURNING id").fetchone()
    assert item is not None
    assert note is not None
    assert top is not None
    assert (item[0], note[0]) == (top[0] + 1, top[1] + 1)


def test_the_source_sequence_position_is_carried_past_the_largest_id(
    tmp_path: Path, pg_server: Any
) -> None:
    """Ids the source drew and never kept (a rolled-back insert, the newest row
    deleted) are not handed out by the promoted target: its next id is the source's
    next id, for tables written while replicating and for one written only before
    the install (its position comes with the install snapshot); and so is a target
    loaded by a reinit, whose tables (identity columns included) txrepl creates."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    ddl = [*DDL, "CREATE TABLE quiet (id serial PRIMARY KEY, body text)"]
    src = psycopg.connect(src_dsn, autocommit=True)
    with psycopg.connect(dst_dsn, autocommit=True) as dst:
        for stmt in ddl:
            src.execute(stmt)
            dst.execute(stmt)

    def unkept(table: str, column: str) -> None:
        """Draw ids that leave no row: a rolled-back insert, then the newest row deleted."""
        src.execute("BEGIN")
        src.execute(f"INSERT INTO {table} ({column}) VALUES ('gone')")
        src.execute("ROLLBACK")  # the id stays drawn
        src.execute(f"INSERT INTO {table} ({column}) VALUES ('kept')")
        src.execute(f"INSERT INTO {table} ({column}) VALUES ('newest')")
        src.execute(f"DELETE FROM {table} WHERE id = (SELECT max(id) FROM {table})")

    _work(src, 0, 4)
    unkept("quiet", "body")  # never written again
    pair = _pair(tmp_path, ["items", "notes", "quiet"], src_dsn, dst_dsn)
    query = (
        "SELECT array(SELECT id FROM items ORDER BY id), array(SELECT id FROM notes ORDER BY id)"
    )
    query += ", array(SELECT id FROM quiet ORDER BY id)"

    try:
        pair.start_publisher()
        _work(src, 4, 6)
        unkept("items", "name")  # in the backlog
        pair.start_subscriber()
        settle(pair, lambda: _differences(src, dst_dsn, query))
        unkept("notes", "body")  # live
        _work(src, 10, 2)
        unkept("items", "name")
        settle(pair, lambda: _differences(src, dst_dsn, query))
        fresh = pg_server.create_database()
        pair.load_snapshot(fresh)
    finally:
        pair.stop()
    ids = {}
    for dsn in (src_dsn, dst_dsn, fresh):  # the source, the promoted target, the reinit's
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids[dsn] = [
                conn.execute(f"INSERT INTO {t} ({c}) VALUES ('local') RETURNING id").fetchone()
                for t, c in (("items", "name"), ("notes", "body"), ("quiet", "body"))
            ]
    src.close()
    assert ids[dst_dsn] == ids[src_dsn]
    assert ids[fresh] == ids[src_dsn]
