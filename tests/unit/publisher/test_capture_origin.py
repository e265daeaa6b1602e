"""SQLite capture and origins (issue 24, common/origin.py R1-R2): what txrepl's apply
wrote is logged under the origin it was applying, the application's writes under the
source's node, and a poll never mixes the two in one entry."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from common.values import decode
from publisher.capture.sqlite.source import SqliteSource
from publisher.publication import Publication
from tests.support.harness import wait_until
from tests.support.pg_capture import open_pub, read_entries


def _setup(tmp_path: Path) -> tuple[sqlite3.Connection, SqliteSource, Publication]:
    conn = sqlite3.connect(tmp_path / "src.db", isolation_level=None)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    source = SqliteSource(tmp_path / "src.db")
    source.install("shop", "inc-1", ["t"])
    pub = open_pub(tmp_path / "logs", "shop", ["t"])
    pub.node = "paris"
    source.pubs = [pub]
    return conn, source, pub


def _applied(conn: sqlite3.Connection, origin: str, ids: range) -> None:
    """Writes as the SQLite writer makes them: inside its marker row."""
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO txrepl_applying (since, origin) VALUES ('now', ?)", (origin,))
    conn.executemany("INSERT INTO t VALUES (?, 'x')", [(i,) for i in ids])
    conn.execute("DELETE FROM txrepl_applying")
    conn.execute("COMMIT")


def test_applied_rows_keep_their_origin_and_polls_split_by_origin(tmp_path: Path) -> None:
    """Local, applied-from-lyon, local again, all waiting for one poll: three entries
    (origins paris, lyon, paris), each with its own rows."""
    conn, source, pub = _setup(tmp_path)
    source.step()  # the install's schema entry
    conn.execute("INSERT INTO t VALUES (1, 'a')")
    _applied(conn, "lyon", range(2, 5))
    conn.execute("INSERT INTO t VALUES (5, 'b')")
    while source.step():
        pass
    entries = read_entries(pub)[1:]
    got = [
        (e.origin, [decode(op.row.row[0]) for op in e.ops if op.HasField("row")]) for e in entries
    ]
    assert got == [("paris", [1]), ("lyon", [2, 3, 4]), ("paris", [5])]
    assert not any(e.continued for e in entries)  # three groups, not one of three origins


def test_streaming_logs_the_rows_a_poll_left_at_an_origin_change(tmp_path: Path) -> None:
    """Rows of two origins committed, then no write at all: streaming logs them all
    (a poll stops where the origin changes, and the rows after it were left until the
    next commit; in a pair the last changes of a node then never left it)."""
    conn, source, pub = _setup(tmp_path)
    conn.execute("INSERT INTO t VALUES (1, 'a')")
    _applied(conn, "lyon", range(2, 5))
    conn.execute("INSERT INTO t VALUES (5, 'b')")
    halt = threading.Event()
    streaming = threading.Thread(target=source.stream, args=([pub], halt))
    streaming.start()
    try:
        wait_until(lambda: pub.log.head >= 3, 30, "the three groups of rows to be logged")
    finally:
        halt.set()
        streaming.join()
    got = [
        (e.origin, [decode(op.row.row[0]) for op in e.ops if op.HasField("row")])
        for e in read_entries(pub)
    ]
    assert got == [("paris", [1]), ("lyon", [2, 3, 4]), ("paris", [5])]


def test_triggers_of_an_earlier_build_are_rebuilt_to_carry_origins(tmp_path: Path) -> None:
    """Capture triggers without the origin (an earlier build's) are rebuilt when the
    publisher starts, in the same generation: no schema op, no copy of the table."""
    conn, source, pub = _setup(tmp_path)
    source.step()
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = '_txrepl_i_t'").fetchone()
    old = sql.replace(", origin)", ")").replace(", (SELECT origin FROM txrepl_applying)", "")
    conn.execute("DROP TRIGGER _txrepl_i_t")
    conn.execute(old)
    SqliteSource(tmp_path / "src.db").install("shop", "inc-1", ["t"])
    _applied(conn, "lyon", range(1, 3))
    while source.step():
        pass
    entries = read_entries(pub)[1:]
    assert [e.origin for e in entries] == ["lyon"]
    assert all(op.HasField("row") for op in entries[0].ops)
