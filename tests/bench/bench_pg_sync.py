"""The PostgreSQL capture thread's CPU per W1 transaction: in sync, in a backlog, warm.

Not a test.  One private PostgreSQL 15 cluster (``tests/bench/_pg.py``), the W1 tables
installed in a publication on a real log (``fsync = "always"``), ``PostgresCapture``
run in a thread of this process (no daemon, no feed: the capture alone).  Figures are
CPU (user + system of the thread's ``/proc`` task), not wall time, so they hold better
than a lag phase's on a shared machine (docs/performance.md, "The capture thread in
sync, by phase"):

``in sync``   ``TXREPL_BENCH_PGSYNC_T`` W1 transactions (default 4,000) committed by a
              child process at ``TXREPL_BENCH_RATE`` txn/s (default 1,000) while the
              capture runs: the capture thread's and its flusher's CPU per
              transaction, and their voluntary context switches per transaction
              (each is a wake-up: a ``poll`` that slept, an ``Event`` or a GIL wait).
``backlog``   capture stopped, 15,000 W1 transactions committed, a new capture thread
              started: its CPU per transaction until all are logged.
``handling``  the pgoutput payloads of 3,000 W1 transactions, recorded from a slot,
              fed to ``Session._handle`` seven times (no socket, no append: the
              entries are dropped at each commit): the best three, warm, per
              transaction, and ``RowWriter.from_message``'s share of it.

    python -m tests.bench pg_sync
    TXREPL_BENCH_PGSYNC_MEASURES=handling python -m tests.bench pg_sync
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import psycopg2
import psycopg2.extras

from publisher.capture.postgres import PostgresCapture
from publisher.capture.postgres._pgtypes import SESSION_GUCS
from publisher.capture.postgres._session import Session
from publisher.config import PublicationConfig
from publisher.log import open_log
from publisher.publication import Publication
from tests.bench._cpu import process_cpu_s
from tests.bench._pg import bench_cluster, pg_reason
from tests.support.workload import W1, pg_source, run_pg

__all__ = ["run"]

TABLES = ["accounts", "orders"]
BACKLOG_T = 15_000
HANDLING_T = 3_000


def _task(tid: int) -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of thread ``tid`` of this process."""
    cpu = process_cpu_s(os.getpid(), f"{os.getpid()}/task/{tid}") or 0.0
    switches = 0
    for line in Path(f"/proc/{os.getpid()}/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            switches = int(line.split()[1])
    return cpu, switches


def _writer(dsn: str, count: int, rate: float, go: Any, reached: Any) -> None:
    """Child process: W1 transactions 1..count, paced at ``rate`` txn/s after ``go``."""
    txns = list(W1().transactions(count + 1))[1:]
    with psycopg.connect(dsn, autocommit=True) as conn:
        go.wait()
        started = time.perf_counter()
        for i, stmts in enumerate(txns):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            with conn.transaction():
                for sql, params in stmts:
                    conn.execute(sql.replace("{p}", "%s"), params)
        reached.value = count / (time.perf_counter() - started)


class _Capture:
    """A capture of the W1 tables into one publication, run in a thread on demand."""

    def __init__(self, dsn: str, root: Path) -> None:
        self.pub = Publication(
            PublicationConfig(name="shop", tables=TABLES),
            open_log(root / "shop", fsync="always"),
        )
        self.cap = PostgresCapture(dsn, slot="shop")
        self.cap.install("shop", self.pub.log.incarnation, TABLES)

    @contextmanager
    def running(self) -> Iterator[threading.Thread]:
        halt = threading.Event()
        failed: list[BaseException] = []

        def body() -> None:
            try:
                self.cap.run([self.pub], halt)
            except BaseException as e:
                failed.append(e)

        thread = threading.Thread(target=body, name="bench-capture", daemon=True)
        thread.start()
        try:
            yield thread
        finally:
            halt.set()
            thread.join(30)
        if failed:
            raise RuntimeError(f"capture failed: {failed[0]!r}") from failed[0]

    def wait(self, head: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pub.log.head < head:
            if time.monotonic() > deadline:
                raise TimeoutError(f"log at {self.pub.log.head}, waited for {head}")
            time.sleep(0.01)

    def close(self) -> None:
        self.cap.close()
        self.pub.log.close()


def _in_sync(dsn: str, root: Path, count: int, rate: float) -> dict[str, Any]:
    source = pg_source(dsn)
    capture = _Capture(dsn, root)
    try:
        with capture.running() as thread:
            run_pg(source, list(W1().transactions(1)))  # the accounts
            capture.wait(capture.pub.log.head + 1)
            time.sleep(1.0)  # the install's snapshot and transaction 0 settled
            flusher = next(t for t in threading.enumerate() if t.name.endswith("-flush"))
            ctx = mp.get_context("spawn")
            go, reached = ctx.Event(), ctx.Value("d", 0.0)
            child = ctx.Process(target=_writer, args=(dsn, count, rate, go, reached))
            child.start()
            time.sleep(2.0)  # the child's imports and its generated stream
            head = capture.pub.log.head
            assert thread.native_id is not None
            assert flusher.native_id is not None
            c0, f0 = _task(thread.native_id), _task(flusher.native_id)
            go.set()
            child.join()
            capture.wait(head + count)
            c1, f1 = _task(thread.native_id), _task(flusher.native_id)
    finally:
        capture.close()
        source.close()
    return {
        "measure": "in sync",
        "transactions": count,
        "rate_reached": round(reached.value),
        "capture_us": round((c1[0] - c0[0]) * 1e6 / count, 1),
        "capture_wakeups": round((c1[1] - c0[1]) / count, 2),
        "flusher_us": round((f1[0] - f0[0]) * 1e6 / count, 1),
        "flusher_wakeups": round((f1[1] - f0[1]) / count, 2),
        "load": round(os.getloadavg()[0], 2),
    }


def _backlog(dsn: str, root: Path, count: int) -> dict[str, Any]:
    source = pg_source(dsn)
    capture = _Capture(dsn, root)
    txns = list(W1().transactions(count + 1))
    try:
        with capture.running():
            run_pg(source, txns[:1])
            capture.wait(capture.pub.log.head + 1)
            time.sleep(0.5)
        head = capture.pub.log.head
        source.execute("SET synchronous_commit = off")
        run_pg(source, txns[1:])
        with capture.running() as thread:
            started = time.perf_counter()
            capture.wait(head + count)
            wall = time.perf_counter() - started
            assert thread.native_id is not None
            cpu, _ = _task(thread.native_id)  # a fresh thread: all of it is this backlog's
    finally:
        capture.close()
        source.close()
    return {
        "measure": "backlog",
        "transactions": count,
        "capture_us": round(cpu * 1e6 / count, 1),
        "wall_s": round(wall, 2),
        "load": round(os.getloadavg()[0], 2),
    }


def _payloads(dsn: str, publication: str, commits: int) -> list[bytes]:
    """The pgoutput payloads of the slot ``raw`` up to its ``commits``-th commit."""
    repl = psycopg2.connect(
        dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection, options=SESSION_GUCS
    )
    try:
        cur = repl.cursor()
        options = {"proto_version": "1", "publication_names": publication, "messages": "true"}
        cur.start_replication(slot_name="raw", decode=False, options=options)
        out: list[bytes] = []
        seen = 0
        while seen < commits:
            msg = cur.read_message()
            if msg is None:
                time.sleep(0.001)
                continue
            out.append(msg.payload)
            seen += msg.payload[:1] == b"C"
        return out
    finally:
        repl.close()


def _handling(dsn: str, root: Path, count: int) -> dict[str, Any]:
    source = pg_source(dsn)
    capture = _Capture(dsn, root)
    cap = capture.cap
    try:
        cap._setup()
        with cap._lock:
            cap._admin().execute("SELECT pg_create_logical_replication_slot('raw', 'pgoutput')")
        run_pg(source, list(W1().transactions(count + 1)))
        payloads = _payloads(dsn, cap.pg_publication, count + 1)
        session = Session(cap, [capture.pub], threading.Event())
        session._reload()
        if session.pending is not None:  # no crossing: the tables count as complete
            session.pending.conn.close()
            session.pending = None
        for table in session.state["shop"].tables.values():
            table.complete = True
        first = payloads.index(next(p for p in payloads if p[:1] == b"C")) + 1
        for p in payloads[:first]:  # transaction 0 (10,000 rows), untimed
            session._handle(p)
        rest = payloads[first:]
        rounds: list[float] = []
        for _ in range(7):
            session.queued.clear()
            started = time.thread_time_ns()
            for p in rest:
                session._handle(p)
                if session.txn is None and session.queued:
                    session.queued.clear()  # the next round reads the same positions again
            rounds.append((time.thread_time_ns() - started) / 1000 / count)
        rows = [
            (session.rels[int.from_bytes(p[1:5], "big")].writer, p)
            for p in rest
            if p[:1] in (b"I", b"U", b"D")
        ]
        wire: list[float] = []
        for _ in range(7):
            started = time.thread_time_ns()
            for writer, p in rows:
                assert writer is not None
                writer.from_message(p)
            wire.append((time.thread_time_ns() - started) / 1000 / count)
    finally:
        capture.close()
        source.close()
    return {
        "measure": "handling",
        "transactions": count,
        "handle_us": round(statistics.mean(sorted(rounds)[:3]), 2),
        "from_message_us": round(statistics.mean(sorted(wire)[:3]), 2),
        "messages_per_txn": round(len(rest) / count, 2),
    }


def run(results_dir: Path) -> list[dict[str, Any]]:
    """Run the measures; print a table; write and return the result rows."""
    reason = pg_reason()
    if reason is not None:
        print(f"bench_pg_sync skipped: {reason}")
        return []
    count = int(os.environ.get("TXREPL_BENCH_PGSYNC_T", "") or 4000)
    rate = float(os.environ.get("TXREPL_BENCH_RATE", "") or 1000)
    wanted = os.environ.get("TXREPL_BENCH_PGSYNC_MEASURES", "") or "in sync,backlog,handling"
    measures = [m.strip() for m in wanted.split(",") if m.strip()]
    rows: list[dict[str, Any]] = []
    for i, measure in enumerate(measures):
        with bench_cluster() as server, tempfile.TemporaryDirectory() as tmp:
            dsn = server.create_database(f"pgsync{i}")
            if measure == "in sync":
                rows.append(_in_sync(dsn, Path(tmp), count, rate))
            elif measure == "backlog":
                rows.append(_backlog(dsn, Path(tmp), BACKLOG_T))
            elif measure == "handling":
                rows.append(_handling(dsn, Path(tmp), HANDLING_T))
            else:
                print(f"bench_pg_sync: unknown measure {measure!r} (in sync, backlog, handling)")
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "bench_pg_sync.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows
