"""Publication-side shaping end to end (issue 25): a real subscriber daemon's target
holds only the published rows and columns, follows a changed filter (rows that left it
deleted, rows that entered it added) and a changed column list, with no reinit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.support.harness import Pair, wait_until

pytestmark = pytest.mark.spark


def _rows(path: Path, cols: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(str(path))
    try:
        return sorted(conn.execute(f"SELECT {cols} FROM orders").fetchall())
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def _columns(path: Path) -> list[str]:
    conn = sqlite3.connect(str(path))
    try:
        return [r[1] for r in conn.execute("PRAGMA table_info(orders)")]
    finally:
        conn.close()


def test_target_follows_the_publication_filter_and_its_changes(tmp_path: Path) -> None:
    """The target gets the eu rows without ``secret``; after the publisher restarts with
    filter ``id <= 3`` and ``secret`` published, the target holds exactly the source's
    rows with id <= 3 (eu row 5 deleted, us row 2 added), secret included, and the
    subscription stays in sync throughout."""
    pair = Pair(
        tmp_path,
        tables=["orders"],
        publication_extra={
            "filter": {"orders": "region = 'eu'"},
            "columns": {"orders": ["id", "region", "note"]},
        },
    )
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, region TEXT, note TEXT, secret TEXT)")
    for i in range(1, 7):
        src.execute(
            "INSERT INTO orders VALUES (?, ?, ?, ?)",
            (i, "eu" if i % 2 else "us", f"n{i}", f"s{i}"),
        )
    try:
        pair.start_publisher()
        pair.start_subscriber()
        pair.wait_caught_up(timeout=120)
        assert _columns(pair.target_path) == ["id", "region", "note"]
        assert _rows(pair.target_path, "id, note") == [(1, "n1"), (3, "n3"), (5, "n5")]

        assert pair.pub is not None
        address = pair.pub.address  # the subscriber reconnects to the same port
        pair.pub.stop()
        pair.publication_extra = {"filter": {"orders": "id <= 3"}}
        pair.start_publisher(listen=address)
        want = src.execute("SELECT * FROM orders WHERE id <= 3 ORDER BY id").fetchall()
        wait_until(
            lambda: pair.status().state == "in_sync" and _rows(pair.target_path, "*") == want,
            120,
            "the target to follow the change",
        )
        assert _columns(pair.target_path) == ["id", "region", "note", "secret"]
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()
        src.close()
