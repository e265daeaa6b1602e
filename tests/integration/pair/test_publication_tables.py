"""Tables entering and leaving a publication while it is replicated, end to end.

The publication's table list is changed in the publisher's configuration and the
publisher restarted (the way to change a publication: there is no admin command and
no reload).  A new table reaches the target with its snapshot and then its changes;
a table taken out stops being captured and its target table is left as it was.
Both sources, both targets, real daemons.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import Pair, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

SCHEMA = """
CREATE TABLE items(id int PRIMARY KEY, name text);
CREATE TABLE extra(id int PRIMARY KEY, note text);
INSERT INTO items VALUES (1, 'a'), (2, 'b');
INSERT INTO extra VALUES (1, 'x'), (2, 'y');
"""


def _rows(url: str, table: str) -> list[tuple[Any, ...]] | None:
    """The target's rows of ``table``, None while it does not exist."""
    query = f"SELECT * FROM {table} ORDER BY 1"
    try:
        if url.startswith("sqlite:///"):
            with sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30) as c:
                return [tuple(r) for r in c.execute(query)]
        with psycopg.connect(url) as pg:
            return [tuple(r) for r in pg.execute(query.encode())]
    except (sqlite3.OperationalError, psycopg.errors.UndefinedTable):
        return None


def _wait_rows(pair: Pair, url: str, table: str, want: list[tuple[Any, ...]]) -> None:
    seen: list[Any] = []

    def done() -> bool:
        seen[:] = [_rows(url, table)]
        return bool(seen[0] == want)

    try:
        wait_until(done, 60, f"the target's {table}", interval=0.3)
    except TimeoutError:
        st = pair.status()
        raise AssertionError(f"state {st.state} ({st.last_error}); {table}: {seen}") from None


@pytest.mark.parametrize("target", ["postgres", "sqlite"])
@pytest.mark.parametrize("source", ["postgres", "sqlite"])
def test_tables_added_and_removed_across_a_publisher_restart(
    tmp_path: Path, pg_server: Any, source: str, target: str
) -> None:
    """``extra`` added to the publication arrives with its rows and later changes;
    ``items`` taken out keeps its target rows and receives no later change."""
    url = pg_server.create_database() if target == "postgres" else f"sqlite:///{tmp_path}/t.db"
    extra: dict[str, Any] = {}
    if source == "postgres":
        dsn = pg_server.create_database()
        src: Any = psycopg.connect(dsn, autocommit=True)
        src.execute(SCHEMA.encode())
        extra = {"slot": "txrepl_" + dsn.rsplit("/", 1)[-1]}
    pair = Pair(
        tmp_path,
        tables=["items"],
        source_url=dsn if source == "postgres" else "",
        target_url=url,
        publisher_extra=extra,
    )
    if source == "sqlite":
        src = sqlite3.connect(str(pair.source_path), isolation_level=None, timeout=30)
        src.execute("PRAGMA journal_mode=WAL")
        src.executescript(SCHEMA)
    try:
        pair.start_publisher()
        pair.start_subscriber()
        _wait_rows(pair, url, "items", [(1, "a"), (2, "b")])
        assert _rows(url, "extra") is None
        assert pair.pub is not None
        listen = "127.0.0.1:" + pair.pub.address.rsplit(":", 1)[1]
        pair.pub.stop()
        src.execute("INSERT INTO extra VALUES (3, 'z')")
        pair.tables = ["extra"]
        pair.start_publisher(listen=listen)
        _wait_rows(pair, url, "extra", [(1, "x"), (2, "y"), (3, "z")])
        src.execute("UPDATE extra SET note = 'w' WHERE id = 1")
        src.execute("INSERT INTO items VALUES (3, 'c')")  # no longer published
        _wait_rows(pair, url, "extra", [(1, "w"), (2, "y"), (3, "z")])
        pair.wait_caught_up(30)
        assert _rows(url, "items") == [(1, "a"), (2, "b")]
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()
        src.close()
