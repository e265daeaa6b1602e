"""PostgreSQL capture of a transaction larger than one entry: fragments, refusals, kill -9.

Run as a script, this file is the child of the kill -9 test: it captures into a
log under the given directory until it is killed in the middle of a transaction's
fragments.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from common.fragments import mark, neutralize
from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres import PostgresCapture
from publisher.errors import RowTooLarge
from tests.support.pg_capture import capturing, execute, open_pub, read_entries, row_ops

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 16 * 1024


def _big_transaction(dsn: str, first: int, n: int, width: int = 200) -> None:
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO docs VALUES (%s, %s)", [(i, "x" * width) for i in range(first, first + n)]
        )


def _applied_ids(entries: list[pb.Entry]) -> list[object]:
    """Row ids as a subscriber applies the log: aborted groups contribute nothing."""
    payloads = [e.SerializeToString() for e in entries]
    kept = neutralize(payloads, [mark(p) for p in payloads])
    return _ids([pb.Entry.FromString(p) for p in kept])


def _ids(entries: list[pb.Entry]) -> list[object]:
    return [r[3][0] for r in row_ops(entries) if r[1] == "INSERT"]


def test_a_large_transaction_is_logged_as_bounded_fragments(pg_db: str, tmp_path: Path) -> None:
    """3,000 rows in one transaction: entries under the limit, one group, every row once."""
    execute(pg_db, "CREATE TABLE docs(id int PRIMARY KEY, body text)")
    pub = open_pub(tmp_path, "p1", ["docs"])
    with capturing(pg_db, [pub], max_entry_bytes=LIMIT) as run:
        before = pub.log.head
        position = pub.position
        _big_transaction(pg_db, 1, 3000)
        execute(pg_db, "INSERT INTO docs VALUES (0, 'after')")

        def complete() -> bool:
            entries = read_entries(pub)
            return 0 in _ids(entries)

        run.wait_heads({"p1": before + 10})
        deadline = time.monotonic() + 30
        while not complete():
            assert time.monotonic() < deadline, "the transaction was not captured"
            time.sleep(0.05)
    payloads = pub.log.read(before + 1, max_entries=10_000, max_bytes=1 << 30)
    group = [pb.Entry.FromString(p) for p in payloads][:-1]  # the last: the 'after' row
    assert len(group) > 20
    assert max(map(len, payloads)) <= LIMIT
    assert [e.fragment for e in group] == list(range(len(group)))
    assert [e.continued for e in group] == [True] * (len(group) - 1) + [False]
    # The fragments but the last name the position before the transaction (P2).
    assert {int(e.source_position) for e in group[:-1]} == {position}
    assert int(group[-1].source_position) > position
    assert _ids(group) == list(range(1, 3001))


def test_a_row_over_the_limit_stops_its_publication_only(pg_db: str, tmp_path: Path) -> None:
    """A 40 KB row is refused with table and key named; the other publication goes on."""
    execute(
        pg_db,
        "CREATE TABLE docs(id int PRIMARY KEY, body text)",
        "CREATE TABLE notes(id int PRIMARY KEY, body text)",
    )
    docs = open_pub(tmp_path, "p_docs", ["docs"])
    notes = open_pub(tmp_path, "p_notes", ["notes"])
    with capturing(pg_db, [docs, notes], max_entry_bytes=LIMIT) as run:
        # Fragments of this transaction are in the log when its last row is refused.
        with psycopg.connect(pg_db) as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO docs VALUES (%s, %s)", [(i, "x" * 200) for i in range(1000, 1200)]
            )
            cur.execute("INSERT INTO docs VALUES (77, %s)", ("y" * 40_000,))
        execute(pg_db, "INSERT INTO notes VALUES (1, 'one')", "INSERT INTO notes VALUES (2, 'two')")
        run.wait_heads({"p_notes": notes.log.head + 1})
        cap: PostgresCapture = run.cap
        refused = cap.refused["p_docs"]
        assert isinstance(refused, RowTooLarge)
        assert "'docs'" in str(refused)
        assert "(77)" in str(refused)
        assert not cap.health.serving_for("p_docs")
        assert cap.health.serving_for("p_notes")
        execute(pg_db, "INSERT INTO notes VALUES (3, 'three')")
        run.wait_heads({"p_notes": notes.log.head + 1})
    assert _ids(read_entries(notes)) == [1, 2, 3]
    assert _applied_ids(read_entries(docs)) == []  # none of the refused transaction
    assert read_entries(docs)[-1].aborted


def test_capture_killed_inside_a_transaction_loses_and_doubles_nothing(
    pg_db: str, tmp_path: Path
) -> None:
    """kill -9 between fragments: the reopened log aborts the group, capture logs it again."""
    execute(pg_db, "CREATE TABLE docs(id int PRIMARY KEY, body text)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, __file__, pg_db, str(tmp_path)]
    child = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stderr is not None
        assert child.stderr.readline().strip() == "running"
        _wait_installed(pg_db)  # else the rows may land in the install snapshot instead
        _big_transaction(pg_db, 1, 20_000)
        segments = tmp_path / "p1"
        deadline = time.monotonic() + 60
        # The records' bytes: the active segment ends with zeros written ahead.
        while sum(len(f.read_bytes().rstrip(b"\0")) for f in segments.glob("*.seg")) < 20 * LIMIT:
            assert time.monotonic() < deadline, "no fragments appeared"
            time.sleep(0.002)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    pub = open_pub(tmp_path, "p1", ["docs"])
    killed = read_entries(pub)
    assert killed[-1].aborted, "the kill did not land inside the transaction"
    with capturing(pg_db, [pub], slot="killed", install=False, max_entry_bytes=LIMIT):
        execute(pg_db, "INSERT INTO docs VALUES (0, 'after')")
        deadline = time.monotonic() + 60
        while 0 not in _applied_ids(read_entries(pub)):
            assert time.monotonic() < deadline, "capture did not catch up"
            time.sleep(0.1)
    assert _applied_ids(read_entries(pub)) == [*range(1, 20_001), 0]


def test_install_snapshot_entries_are_bounded_and_a_huge_row_refused(
    pg_db: str, tmp_path: Path
) -> None:
    """Rows present at install are logged in entries under the limit; one over it is refused."""
    execute(
        pg_db,
        "CREATE TABLE docs(id int PRIMARY KEY, body text)",
        "CREATE TABLE notes(id int PRIMARY KEY, body text)",
    )
    _big_transaction(pg_db, 1, 2000)
    execute(pg_db, "INSERT INTO notes SELECT g, repeat('z', 40000) FROM generate_series(1, 3) g")
    docs = open_pub(tmp_path, "p_docs", ["docs"])
    notes = open_pub(tmp_path, "p_notes", ["notes"])
    with capturing(pg_db, [docs], max_entry_bytes=LIMIT):
        pass
    payloads = docs.log.read(1, max_entries=10_000, max_bytes=1 << 30)
    assert len(payloads) > 10
    assert max(map(len, payloads)) <= LIMIT
    assert _ids([pb.Entry.FromString(p) for p in payloads]) == list(range(1, 2001))
    cap = PostgresCapture(pg_db, slot="refusing", max_entry_bytes=LIMIT)
    try:
        cap.check()
        cap.install(notes.name, notes.log.incarnation, notes.config.tables)
        stop = threading.Event()
        runner = threading.Thread(target=cap.run, args=([notes], stop), daemon=True)
        runner.start()
        deadline = time.monotonic() + 60
        while "p_notes" not in cap.refused:
            assert time.monotonic() < deadline, "the 40 KB row was not refused"
            time.sleep(0.05)
        stop.set()
        runner.join(30)
    finally:
        cap.close()
    assert "'notes'" in str(cap.refused["p_notes"])
    assert "(1)" in str(cap.refused["p_notes"])
    with psycopg.connect(pg_db) as conn:
        done = conn.execute(
            "SELECT done FROM _txrepl.installs WHERE publication = 'p_notes'"
        ).fetchone()
    assert done == (False,)  # a restart with a larger limit takes the snapshot again


def _wait_installed(dsn: str) -> None:
    """Until every installed table's snapshot is logged (``_txrepl.installs.done``)."""
    deadline = time.monotonic() + 60
    while True:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT bool_and(done) FROM _txrepl.installs").fetchone()
        if row and row[0]:
            return
        assert time.monotonic() < deadline, "the install snapshot was not logged"
        time.sleep(0.02)


def _child(dsn: str, logs: Path) -> None:
    pub = open_pub(logs, "p1", ["docs"])
    cap = PostgresCapture(dsn, slot="killed", max_entry_bytes=LIMIT)
    cap.check()
    cap.install(pub.name, pub.log.incarnation, pub.config.tables)
    print("running", file=sys.stderr, flush=True)
    cap.run([pub], threading.Event())


if __name__ == "__main__":
    _child(sys.argv[1], Path(sys.argv[2]))
