"""ALTER TABLE on a published PostgreSQL table, end to end, into both targets.

Real daemons (publisher on a real PostgreSQL source through logical decoding, a
subscriber applying through Spark) and the target compared with the source on the
source's current columns: ADD COLUMN with a constant and a volatile default (the
existing rows take values no row change carries), DROP COLUMN, RENAME COLUMN and a
type change through a USING expression, with writes around each; the subscriber
running, or started after everything (one batch); and across publisher restarts.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import Pair, wait_until
from tests.support.workload import diff_tables

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

SCHEMA = (
    "CREATE TABLE items(id int PRIMARY KEY, name text, c text, qty int);"
    "INSERT INTO items SELECT g, 'n' || g, 'c' || g, g FROM generate_series(1, 5) g;"
)


def _columns(src: psycopg.Connection[Any]) -> list[str]:
    return [
        str(r[0])
        for r in src.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'items'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
    ]


def _target(kind: str, tmp_path: Path, dsn: str) -> tuple[str, Any]:
    """(the subscriber's target URL, a function opening a connection to it)."""
    if kind == "postgres":
        return dsn, lambda: psycopg.connect(dsn)
    path = tmp_path / "target.db"
    return f"sqlite:///{path}", lambda: sqlite3.connect(str(path), timeout=30)


def _wait_equal(src: psycopg.Connection[Any], target: Any, pair: Pair) -> None:
    """Target rows = source rows on the source's current columns, subscription in sync."""
    last: list[str] = []

    def same() -> bool:
        nonlocal last
        dst = target()
        try:
            last = diff_tables(src, dst, {"items": tuple(_columns(src))}, limit=3)
        except Exception as exc:  # the target may be mid-change
            last = [str(exc)]
        finally:
            dst.close()
        return not last and pair.status().state == "in_sync"

    try:
        wait_until(same, 120, "the target to equal the source", interval=0.3)
    except TimeoutError:
        st = pair.status()
        raise AssertionError(
            f"state {st.state} ({st.last_error}); target differs:\n" + "\n".join(last)
        ) from None


def _migrations(src: psycopg.Connection[Any]) -> None:
    """Each schema change, with a write of the table after it (the relation message)."""
    # A constant default: the existing rows get it from the catalog, not the WAL.
    src.execute("ALTER TABLE items ADD COLUMN note text DEFAULT 'n'")
    src.execute("INSERT INTO items(id, name, c, qty) VALUES (10, 'n10', 'c10', 10)")
    # A volatile default: PostgreSQL rewrites the table, undecoded.
    src.execute("ALTER TABLE items ADD COLUMN tag text DEFAULT md5(random()::text)")
    src.execute("UPDATE items SET name = 'upd' WHERE id = 1")
    src.execute("ALTER TABLE items DROP COLUMN c")
    src.execute("INSERT INTO items(id, name, qty) VALUES (11, 'n11', 11)")
    src.execute("DELETE FROM items WHERE id = 2")
    src.execute("ALTER TABLE items RENAME COLUMN name TO title")
    src.execute("UPDATE items SET qty = 33 WHERE id = 3")
    # A type change whose values the target's own cast would get wrong.
    src.execute("ALTER TABLE items ALTER COLUMN qty TYPE text USING 'q' || qty")
    src.execute("INSERT INTO items(id, title, qty) VALUES (12, 't12', 'q12')")


def _setup(
    tmp_path: Path, pg_server: Any, kind: str, more_sql: str = ""
) -> tuple[psycopg.Connection[Any], Any, str, Pair]:
    """(source connection, target opener, target URL, the pair) over fresh databases."""
    src_dsn = pg_server.create_database()
    target_url, target = _target(kind, tmp_path, pg_server.create_database())
    src = psycopg.connect(src_dsn, autocommit=True)
    src.execute(SCHEMA)
    if more_sql:
        src.execute(more_sql.encode())
    pair = Pair(
        tmp_path,
        tables=["items"],
        source_url=src_dsn,
        target_url=target_url,
        publisher_extra={"slot": "txrepl_" + src_dsn.rsplit("/", 1)[-1]},
    )
    return src, target, target_url, pair


@pytest.mark.parametrize("mode", ["running", "paused"])
@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_alter_table_on_a_postgresql_source(
    tmp_path: Path, pg_server: Any, kind: str, mode: str
) -> None:
    """ADD COLUMN with constant and volatile defaults, DROP, RENAME and a type change
    with USING: the target ends equal to the source, values and columns."""
    src, target, target_url, pair = _setup(tmp_path, pg_server, kind)
    try:
        pair.start_publisher()
        # the install snapshot is logged before the changes, so they travel as changes
        wait_until(lambda: pair.head() > 0, 60, "the install snapshot")
        if mode == "running":
            pair.start_subscriber()
            _wait_equal(src, target, pair)
        _migrations(src)
        if mode == "paused":
            pair.start_subscriber()
        _wait_equal(src, target, pair)
        dst = target()
        cur = dst.cursor()
        cur.execute("SELECT note FROM items WHERE id = 4")
        assert cur.fetchone() == ("n",)  # the silent divergence: it was NULL
        dst.close()
        if kind == "postgres":
            with psycopg.connect(target_url) as dst_pg:
                have = [
                    str(r[0])
                    for r in dst_pg.execute(
                        "SELECT attname FROM pg_attribute WHERE attrelid = 'items'::regclass"
                        " AND attnum > 0 AND NOT attisdropped ORDER BY attname"
                    )
                ]
                qty = dst_pg.execute(
                    "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                    " WHERE attrelid = 'items'::regclass AND attname = 'qty'"
                ).fetchone()
            assert have == sorted(_columns(src))  # dropped and renamed-away columns gone
            assert qty == ("text",)
    finally:
        pair.stop()
        src.close()


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_alter_table_while_the_publisher_is_down(tmp_path: Path, pg_server: Any, kind: str) -> None:
    """Schema changes made while the publisher is stopped, and one just before a stop:
    after each restart the target ends equal to the source."""
    src, target, _, pair = _setup(tmp_path, pg_server, kind)
    try:
        pair.start_publisher()
        pair.start_subscriber()
        _wait_equal(src, target, pair)
        assert pair.pub is not None
        listen = "127.0.0.1:" + pair.pub.address.rsplit(":", 1)[1]
        pair.pub.stop()
        _migrations(src)
        pair.start_publisher(listen=listen)
        _wait_equal(src, target, pair)
        # The change and its first row decoded, then an abrupt stop.
        src.execute("ALTER TABLE items ADD COLUMN late int DEFAULT 7")
        src.execute("INSERT INTO items(id, title, qty) VALUES (13, 't13', 'q13')")
        pair.pub.kill()
        src.execute("UPDATE items SET title = 'after' WHERE id = 4")
        pair.start_publisher(listen=listen)
        _wait_equal(src, target, pair)
    finally:
        pair.stop()
        src.close()


def _wait_logged(pair: Pair, at_least: int) -> None:
    """Wait until the head reached ``at_least`` and then stayed put for 3 s."""
    last = [pair.head(), time.monotonic()]

    def settled() -> bool:
        head = pair.head()
        if head != last[0]:
            last[:] = [head, time.monotonic()]
        return head >= at_least and time.monotonic() - last[1] > 3

    wait_until(settled, 90, "the changes to be logged", interval=0.2)


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_subscriber_killed_during_the_schema_change_batch(
    tmp_path: Path, pg_server: Any, kind: str
) -> None:
    """kill -9 of the subscriber while it applies the schema changes and the table's
    copy (one batch): restarted, it ends equal to the source."""
    src, target, _, pair = _setup(
        tmp_path,
        pg_server,
        kind,
        "INSERT INTO items SELECT g, 'n', 'c', g FROM generate_series(100, 30000) g",
    )
    try:
        pair.start_publisher()
        pair.start_subscriber()
        _wait_equal(src, target, pair)
        assert pair.sub is not None
        pair.sub.stop()
        before = pair.head()
        _migrations(src)
        _wait_logged(pair, before + 7)  # six row changes, and at least one copy
        sub = pair.start_subscriber()
        wait_until(lambda: pair.status().state != "connecting", 60, "the subscriber to start")
        sub.kill()
        pair.start_subscriber()
        _wait_equal(src, target, pair)
    finally:
        pair.stop()
        src.close()
