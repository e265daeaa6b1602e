"""PostgreSQL capture SIGKILLed at random moments: nothing lost, nothing duplicated.

A child process runs the real capture into real logs; the test kills it with SIGKILL at
random moments (during the initial snapshot, mid-stream, between append and slot
confirmation) while a writer keeps committing transactions that touch two publications,
restarts it, and finally checks every log against the source.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from tests.support.pg_capture import open_pub, read_entries, row_ops

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import sys, threading
sys.path.insert(0, {root!r})
from pathlib import Path
from publisher.capture.postgres import PostgresCapture
from publisher.config import PublicationConfig
from publisher.log import open_log
from publisher.publication import Publication

dsn, logs = sys.argv[1], Path(sys.argv[2])
pubs = [
    Publication(PublicationConfig(name=n, tables=t), open_log(logs / n, fsync="always"))
    for n, t in (("pa", ["k1", "shared"]), ("pb", ["k2", "shared"]))
]
cap = PostgresCapture(dsn, slot="crashy", snapshot_chunk_rows=1500, feedback_interval_s=0.05)
cap.check()
for p in pubs:
    cap.install(p.name, p.log.incarnation, p.config.tables)
print("running", flush=True)
cap.run(pubs, threading.Event())
"""

PREEXISTING = 30_000


class Writer(threading.Thread):
    """Commits transaction i: a row in k1 (pa), a row in k2 (pb), +1 on shared (both)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.committed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                i = 0
                while not self.stop.is_set():
                    i += 1
                    with conn.transaction():
                        conn.execute("INSERT INTO k1 VALUES (%s, %s)", (PREEXISTING + i, i))
                        conn.execute("INSERT INTO k2 VALUES (%s, %s)", (i, i))
                        conn.execute("UPDATE shared SET n = n + 1 WHERE id = 1")
                    self.committed = i
                    time.sleep(random.uniform(0, 0.004))
        except BaseException as e:  # surfaced by the test
            self.error = e


def _spawn(dsn: str, logs: Path, out: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start a capturing child whose output goes to ``out`` (appended); also return
    where its output starts in that file.

    A file, not a pipe: a long-running child logs more than a pipe holds, and one
    that nobody reads blocks the child on its next log line.
    """
    start = out.stat().st_size if out.exists() else 0
    with open(out, "ab") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD.format(root=str(ROOT)), dsn, str(logs)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return child, start


def _output(out: Path, start: int) -> str:
    return out.read_bytes()[start:].decode(errors="replace")


def _wait_running(child: subprocess.Popen[bytes], out: Path, start: int) -> None:
    deadline = time.monotonic() + 60
    while "running" not in _output(out, start) and child.poll() is None:
        assert time.monotonic() < deadline, "the child did not start capturing"
        time.sleep(0.01)


def _replay(entries: list[pb.Entry], tables: set[str]) -> dict[str, dict[object, list[object]]]:
    """Apply a log's row ops to an empty model of its tables (as a subscriber would)."""
    state: dict[str, dict[object, list[object]]] = {t: {} for t in tables}
    for table, op, key, row in row_ops(entries):
        rows = state[table]
        if op == "TRUNCATE":
            rows.clear()
        elif op == "INSERT":
            assert row[0] not in rows, f"{table}: duplicate insert of {row[0]}"
            rows[row[0]] = row
        elif op == "UPDATE":
            assert key[0] in rows, f"{table}: update of missing {key[0]}"
            del rows[key[0]]
            rows[row[0]] = row
        else:
            assert key[0] in rows, f"{table}: delete of missing {key[0]}"
            del rows[key[0]]
    return state


def _source(dsn: str, table: str) -> dict[object, list[object]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: list(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY 1")}


@pytest.mark.parametrize(
    "kills",
    [
        pytest.param(
            22,
            marks=pytest.mark.short_of(
                "test_sigkill_during_capture_loses_and_duplicates_nothing[60]"
            ),
        ),
        pytest.param(60, marks=pytest.mark.slow),
    ],
)
def test_sigkill_during_capture_loses_and_duplicates_nothing(
    pg_db: str, tmp_path: Path, kills: int
) -> None:
    """Repeated SIGKILLs of the capturing process: every log equals the source, each
    streamed transaction logged once, in commit order."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE k1(id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE k2(id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE shared(id int PRIMARY KEY, n int NOT NULL)")
        conn.execute(f"INSERT INTO k1 SELECT g, -g FROM generate_series(1, {PREEXISTING}) g")
        conn.execute("INSERT INTO shared VALUES (1, 0)")
    logs = tmp_path / "logs"
    out = tmp_path / "children.out"
    writer = Writer(pg_db)
    writer.start()
    rng = random.Random(int(os.environ.get("TXREPL_SEED", "0")) or None)
    errors: list[str] = []
    try:
        for k in range(kills):
            child, start = _spawn(pg_db, logs, out)
            if k % 2 == 0:
                # Right after installation: in the snapshot or the first transactions.
                _wait_running(child, out, start)
                time.sleep(rng.uniform(0.0, 0.4))
            else:
                # Anywhere from start-up to well into streaming.
                time.sleep(rng.uniform(0.2, 2.0))
            if child.poll() is not None:
                errors.append(_output(out, start))
                break
            child.send_signal(signal.SIGKILL)
            child.wait()
    finally:
        writer.stop.set()
        writer.join(10)
    assert not errors, errors[0][-3000:]
    assert writer.error is None, writer.error
    assert writer.committed > kills  # the writer kept writing throughout

    # A last run: once its snapshots are complete (kills may have cut the previous ones
    # short), 25 more transactions are streamed; it is done when the slot confirms them.
    n = writer.committed
    with psycopg.connect(pg_db, autocommit=True) as conn:
        child, start = _spawn(pg_db, logs, out)

        def alive() -> None:
            assert child.poll() is None, _output(out, start)[-3000:]

        deadline = time.monotonic() + 120
        while conn.execute(
            "SELECT bool_and(done) FROM _txrepl.installs WHERE slot = 'crashy'"
        ).fetchone() != (True,):
            alive()
            assert time.monotonic() < deadline, (
                f"snapshots not completed: {_output(out, start)[-3000:]}"
            )
            time.sleep(0.05)
        for _ in range(25):
            n += 1
            with conn.transaction():
                conn.execute("INSERT INTO k1 VALUES (%s, %s)", (PREEXISTING + n, n))
                conn.execute("INSERT INTO k2 VALUES (%s, %s)", (n, n))
                conn.execute("UPDATE shared SET n = n + 1 WHERE id = 1")
        (target,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()  # type: ignore[misc]
        while True:
            (done,) = conn.execute(
                "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots"
                " WHERE slot_name = 'crashy'",
                (target,),
            ).fetchone()  # type: ignore[misc]
            if done:
                break
            alive()
            assert time.monotonic() < deadline, "capture did not catch up"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait()

    for name, tables in (("pa", ["k1", "shared"]), ("pb", ["k2", "shared"])):
        pub = open_pub(logs, name, tables)
        entries = read_entries(pub)
        pub.log.close()
        # The log, replayed, is exactly the source (TRUNCATE opens every snapshot, so a
        # snapshot cut short by a kill is superseded by the next one).
        model = _replay(entries, set(tables))
        for t in tables:
            assert model[t] == _source(pg_db, t), f"{name}.{t} differs from the source"
        # Streamed transactions: one entry each, strictly increasing commit LSNs, and the
        # writer's i values consecutive up to the last one (none lost or doubled).
        # Commit LSNs are 8-byte aligned; snapshot entries sit at C - 2 and C - 1.
        streamed = [e for e in entries if int(e.source_position) % 8 == 0]
        positions = [int(e.source_position) for e in streamed]
        assert positions == sorted(set(positions)), f"{name}: positions not strictly increasing"
        key_table = tables[0]
        ids = [r[3][1] for r in row_ops(streamed) if r[0] == key_table and r[1] == "INSERT"]
        assert ids, f"{name}: nothing streamed"
        first = ids[0]
        assert isinstance(first, int)
        assert ids == list(range(first, n + 1)), f"{name}: gap or duplicate"
        assert model["shared"][1] == [1, n]
        snapshots = sum(1 for r in row_ops(entries) if r[1] == "TRUNCATE" and r[0] == key_table)
        print(f"{name}: {len(entries)} entries, {snapshots} snapshot(s) of {key_table}, {n} txns")
