"""Procedure calls captured in the source transaction (issue 25), real daemons end to
end: the call is applied once on the target, where it stood among the transaction's
row changes, and the rows it changed at the source are not applied a second time."""

from __future__ import annotations

import sqlite3
import textwrap
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from common.calls import call_procedure, captured_call
from tests.support.harness import Pair, wait_until

pytestmark = pytest.mark.spark

# The procedure: appends ``label`` to every item's name and notes the call in ``audit``
# (a table no publication carries: it changes on the target only if the call runs there).
PG_PROC = """
CREATE TABLE audit (label text);
CREATE PROCEDURE bump(label text) LANGUAGE plpgsql AS $$
BEGIN
  UPDATE items SET name = name || label;
  INSERT INTO audit VALUES (label);
END $$;
"""

HANDLERS = """
def bump(conn, label):
    conn.execute("UPDATE items SET name = name || ?", (label,))
    conn.execute("INSERT INTO audit VALUES (?)", (label,))
"""


def _handler_package(root: Path) -> Path:
    """A directory holding a module and its distribution's entry point registering it
    as the ``bump`` handler (``txrepl.procedures``), for the daemons' PYTHONPATH."""
    root.mkdir()
    (root / "calls_handlers.py").write_text(textwrap.dedent(HANDLERS))
    info = root / "calls_handlers-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: calls-handlers\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[txrepl.procedures]\nbump = calls_handlers:bump\n")
    return root


def _sqlite_rows(path: Path, query: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(str(path))
    try:
        return sorted(conn.execute(query).fetchall())
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def _pg_rows(dsn: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        try:
            return sorted(conn.execute(query).fetchall())
        except psycopg.Error:
            return []


def _settle(pair: Pair, count: Callable[[], int], n: int) -> None:
    """Wait until the target holds ``n`` items (or the subscription stopped in error),
    then until it is caught up; it must be in sync."""
    wait_until(
        lambda: count() == n or pair.status().state == "error",
        120,
        f"the target to get {n} items",
        interval=0.2,
    )
    st = pair.status()
    assert st.state != "error", f"last error: {st.last_error}"
    pair.wait_caught_up()
    st = pair.status()
    assert st.state == "in_sync", f"last error: {st.last_error}"


def test_sqlite_source_call_applied_once_in_order(tmp_path: Path) -> None:
    """On a SQLite source, a transaction inserts item 1, makes the ``bump('+')`` call
    through ``captured_call`` (its body renames every item and writes ``audit``), then
    inserts item 2: the target's registered ``bump`` handler runs once between the two
    inserts (item 1 renamed once, item 2 not, one audit row on the target), and a call
    whose body raised leaves nothing anywhere."""
    src_path = tmp_path / "source.db"
    src = sqlite3.connect(str(src_path), isolation_level=None)
    src.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT)")
    src.execute("CREATE TABLE audit(label TEXT)")
    tgt = sqlite3.connect(str(tmp_path / "target.db"))
    tgt.execute("CREATE TABLE audit(label TEXT)")
    tgt.close()
    handlers = _handler_package(tmp_path / "handlers")
    pair = Pair(
        tmp_path,
        tables=["items"],
        publication_extra={"procedures": ["bump"]},
        env={"PYTHONPATH": str(handlers)},
    )
    namespace: dict[str, object] = {}
    exec(textwrap.dedent(HANDLERS), namespace)
    bump = namespace["bump"]
    try:
        pair.start_publisher()
        pair.start_subscriber()
        src.execute("BEGIN")
        src.execute("INSERT INTO items VALUES (1, 'a')")
        with captured_call(src, "bump", "+"):
            bump(src, "+")  # type: ignore[operator]
        src.execute("INSERT INTO items VALUES (2, 'b')")
        src.execute("COMMIT")
        src.execute("BEGIN")

        def failing_call() -> None:
            with captured_call(src, "bump", "!"):
                bump(src, "!")  # type: ignore[operator]
                raise ZeroDivisionError

        with pytest.raises(ZeroDivisionError):
            failing_call()
        src.execute("INSERT INTO items VALUES (3, 'c')")
        src.execute("COMMIT")
        want = [(1, "a+"), (2, "b"), (3, "c")]
        assert _sqlite_rows(src_path, "SELECT id, name FROM items") == want
        _settle(pair, lambda: len(_sqlite_rows(pair.target_path, "SELECT id FROM items")), 3)
        assert _sqlite_rows(pair.target_path, "SELECT id, name FROM items") == want
        assert _sqlite_rows(pair.target_path, "SELECT label FROM audit") == [("+",)]
    finally:
        pair.stop()
        src.close()


@pytest.mark.postgres
@pytest.mark.parametrize("plugin", ["pgoutput", "wal2json"])
def test_postgres_source_call_applied_once_in_order(tmp_path: Path, pg_server, plugin: str) -> None:
    """On a PostgreSQL source, a transaction inserts item 1, runs ``CALL bump('+')``
    through ``call_procedure``, then inserts item 2: the target's same-named procedure
    runs once between the inserts (item 1 renamed once, item 2 not, one audit row on the
    target), under pgoutput and wal2json alike."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    with psycopg.connect(src_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        c.execute(PG_PROC)
    with psycopg.connect(dst_dsn, autocommit=True) as c:
        c.execute(PG_PROC)
    pair = Pair(
        tmp_path,
        tables=["items"],
        source_url=src_dsn,
        target_url=dst_dsn,
        publisher_extra={"slot": f"txrepl_calls_{plugin}", "plugin": plugin},
        publication_extra={"procedures": ["bump"]},
    )
    try:
        pair.start_publisher()
        pair.start_subscriber()
        with psycopg.connect(src_dsn) as src:  # one transaction, committed on exit
            src.execute("INSERT INTO items VALUES (1, 'a')")
            call_procedure(src, "bump", "+")
            src.execute("INSERT INTO items VALUES (2, 'b')")
        want = [(1, "a+"), (2, "b")]
        assert _pg_rows(src_dsn, "SELECT id, name FROM items") == want
        _settle(pair, lambda: len(_pg_rows(dst_dsn, "SELECT id FROM items")), 2)
        assert _pg_rows(dst_dsn, "SELECT id, name FROM items") == want
        assert _pg_rows(dst_dsn, "SELECT label FROM audit") == [("+",)]
    finally:
        pair.stop()
