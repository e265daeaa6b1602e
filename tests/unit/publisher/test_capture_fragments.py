"""SQLite capture in bounded pieces: a backlog becomes fragments, a huge row is refused.

Run as a script, this file is the child of the kill -9 test: it captures the
backlog of ``src.db`` into the publication log under ``logs/`` and is killed
while it writes the group's fragments.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.fragments import mark, neutralize
from common.rpc import txrepl_pb2 as pb
from common.values import decode
from publisher.capture.sqlite.source import SqliteSource
from publisher.errors import RowTooLarge
from publisher.publication import Publication
from tests.support.pg_capture import open_pub, read_entries

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 16 * 1024


def _source(path: Path, tables: tuple[str, ...] = ("docs",)) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for t in tables:
        conn.execute(f"CREATE TABLE {t}(id INTEGER PRIMARY KEY, body TEXT)")
    return conn


def _backlog(conn: sqlite3.Connection, table: str, first: int, n: int, width: int) -> None:
    """``n`` rows of ``width`` characters, in transactions of 100 rows."""
    for start in range(first, first + n, 100):
        conn.execute("BEGIN")
        conn.executemany(
            f"INSERT INTO {table} VALUES (?, ?)",
            [(i, f"{i:08d}" + "x" * width) for i in range(start, min(start + 100, first + n))],
        )
        conn.execute("COMMIT")


def _ids(entries: list[pb.Entry]) -> list[int]:
    out: list[int] = []
    for e in entries:
        for op in e.ops:
            if op.HasField("row"):
                value = decode(op.row.row[0])
                assert isinstance(value, int)
                out.append(value)
    return out


def _capture(tmp_path: Path, names: tuple[str, ...], limit: int = LIMIT) -> SqliteSource:
    source = SqliteSource(tmp_path / "src.db", max_entry_bytes=limit)
    for name in names:
        source.install(name, "inc-1", [name.removeprefix("p_")])
    return source


def test_a_large_backlog_becomes_bounded_entries_of_one_group(tmp_path: Path) -> None:
    """A publisher restarted on a 2 MB backlog writes entries under the limit, as one group."""
    conn = _source(tmp_path / "src.db")
    source = _capture(tmp_path, ("p_docs",))
    _backlog(conn, "docs", 1, 2000, 1000)  # written while the publisher was down
    pub = open_pub(tmp_path / "logs", "p_docs", ["docs"])
    source.pubs = [pub]
    source.step()
    payloads = _payloads(pub)
    entries = [pb.Entry.FromString(p) for p in payloads]
    assert len(entries) > 50
    assert max(map(len, payloads)) <= LIMIT
    assert [e.fragment for e in entries] == list(range(len(entries)))
    assert [e.continued for e in entries] == [True] * (len(entries) - 1) + [False]
    assert _ids(entries) == list(range(1, 2001))
    # Every fragment but the last names the resume point before the group (P2).
    assert {e.source_position for e in entries[:-1]} == {"0"}
    assert pub.position == int(entries[-1].source_position) > 0


def test_a_row_over_the_limit_is_refused_by_name_and_other_publications_go_on(
    tmp_path: Path,
) -> None:
    """One 40 KB row stops its publication with table and key named; the other is captured."""
    conn = _source(tmp_path / "src.db", ("docs", "notes"))
    source = _capture(tmp_path, ("p_docs", "p_notes"))
    _backlog(conn, "docs", 1, 50, 100)
    conn.execute("INSERT INTO docs VALUES (77, ?)", ("y" * 40_000,))
    _backlog(conn, "notes", 1, 300, 100)
    docs = open_pub(tmp_path / "logs", "p_docs", ["docs"])
    notes = open_pub(tmp_path / "logs", "p_notes", ["notes"])
    source.pubs = [docs, notes]
    source.step()
    refused = source.refused["p_docs"]
    assert isinstance(refused, RowTooLarge)
    assert "'docs'" in str(refused)
    assert "id=77" in str(refused)
    assert "max_entry_bytes" in str(refused)
    # Health tells: that publication's capture is not serving, the other one is.
    assert not source.health.serving_for("p_docs")
    assert "id=77" in source.health.error_for("p_docs")
    assert source.health.serving_for("p_notes")
    assert _ids(read_entries(notes)) == list(range(1, 301))
    # Nothing of the docs group reaches a subscriber: an open group was aborted (P3),
    # and the position stays before it, so its rows stay in the source.
    assert not _ids([pb.Entry.FromString(p) for p in _neutralized(docs)])
    assert docs.position == 0
    _backlog(conn, "notes", 301, 10, 100)
    source.step()  # capture goes on for the other publication
    assert _ids(read_entries(notes))[-1] == 310


def _payloads(pub: Publication) -> list[bytes]:
    return [e.SerializeToString() for e in read_entries(pub)]


def _neutralized(pub: Publication) -> list[bytes]:
    """The log as a subscriber applies it: aborted groups' fragments empty (rule S2)."""
    payloads = _payloads(pub)
    return neutralize(payloads, [mark(p) for p in payloads])


def test_publisher_killed_while_writing_fragments_loses_and_doubles_nothing(
    tmp_path: Path,
) -> None:
    """kill -9 mid-group: the reopened log aborts the open group; capture carries it again."""
    conn = _source(tmp_path / "src.db")
    _capture(tmp_path, ("p_docs",)).release()
    _backlog(conn, "docs", 1, 4000, 1000)
    segments = tmp_path / "logs" / "p_docs"
    child = subprocess.Popen(
        [sys.executable, __file__, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # The records' bytes: the active segment ends with zeros written ahead.
            size = (
                sum(len(f.read_bytes().rstrip(b"\0")) for f in segments.glob("*.seg"))
                if segments.exists()
                else 0
            )
            if size > 20 * LIMIT:  # a few fragments durable, most still to come
                break
            assert child.poll() is None, "the child ended before it could be killed"
            time.sleep(0.005)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    pub = open_pub(tmp_path / "logs", "p_docs", ["docs"])
    killed = read_entries(pub)
    assert killed[-1].aborted, "the kill did not land inside the group"
    assert not killed[-1].ops
    assert killed[-2].continued
    source = SqliteSource(tmp_path / "src.db", max_entry_bytes=LIMIT)
    source.pubs = [pub]
    source.step()
    applied = [pb.Entry.FromString(p) for p in _neutralized(pub)]
    assert _ids(applied) == list(range(1, 4001))


def _child(workdir: Path) -> None:
    """Capture the backlog, slowly enough (an fsync per fragment) to be killed inside."""
    source = SqliteSource(workdir / "src.db", max_entry_bytes=LIMIT)
    source.pubs = [open_pub(workdir / "logs", "p_docs", ["docs"])]
    source.step()
    time.sleep(60)


if __name__ == "__main__":
    _child(Path(sys.argv[1]))

pytestmark = pytest.mark.timeout(120)
