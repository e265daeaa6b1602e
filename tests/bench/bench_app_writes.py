"""The application's own write time on a SQLite source, with and without capture (issue 21 c).

Two workloads, each run on a fresh source file in two modes side by side, alternating,
``TXREPL_BENCH_APPW_REPEATS`` times (default 3), medians reported with their ratio:

* ``narrow``: ``TXREPL_BENCH_APPW_T`` W1 transactions (default 5,000) after the
  10,000 accounts: an order insert, an account update, sometimes a status update or a
  delete, one SQLite transaction each, at full speed.
* ``large``: 40 documents of about 100 KB text, then ``TXREPL_BENCH_APPW_DOC_UPDATES``
  (default 400) transactions each rewriting one document's body (a document store).

Modes: ``plain`` (no publisher ever ran on the file) and ``captured`` (a publisher
daemon runs on it: its triggers are installed and it captures while the application
writes, taking SQLite's write lock to read and release capture rows).  The figure is
the application's wall time for the workload; the goal is ``captured`` at most 1.5 times
``plain``.  The publisher's lock waits (``txrepl_capture_lock_waits_total``) are
reported beside it, and so is the application's CPU time (``*_cpu_s``: SQLite runs in
this process, the publisher in another): on a loaded machine the wall time is mostly
time spent waiting for a core and varies 2x from run to run, the CPU time much less.

    .venv/bin/python -m tests.bench app_writes
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench.bench_w1 import _env_int, scrubbed_bench_env
from tests.support.harness import Pair, wait_until
from tests.support.workload import W1, run_sqlite, sqlite_source

DOCS = 40
DOC_BYTES = 100_000


def _installed(path: Path, tables: list[str]) -> bool:
    with sqlite3.connect(str(path), timeout=5) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    return all(any(t in n for n in names) for t in tables)


def _lock_waits(metrics: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("txrepl_capture_lock_waits_total")
    )


def _narrow(conn: sqlite3.Connection) -> Callable[[], None]:
    w1 = W1(seed=7)
    run_sqlite(conn, [w1.transaction()])  # the accounts: not timed
    txns = list(w1.transactions(_env_int("TXREPL_BENCH_APPW_T", 5000)))

    def write() -> None:
        run_sqlite(conn, txns)

    return write


def _large(conn: sqlite3.Connection) -> Callable[[], None]:
    conn.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, version INTEGER, body TEXT)")
    rng = random.Random(11)
    conn.execute("BEGIN")
    for i in range(DOCS):
        conn.execute("INSERT INTO docs VALUES (?, 0, ?)", (i, rng.randbytes(DOC_BYTES // 2).hex()))
    conn.execute("COMMIT")
    updates = [
        (rng.randrange(DOCS), rng.randbytes(DOC_BYTES // 2).hex())
        for _ in range(_env_int("TXREPL_BENCH_APPW_DOC_UPDATES", 400))
    ]

    def write() -> None:
        for doc, body in updates:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE docs SET version = version + 1, body = ? WHERE id = ?", (body, doc)
            )
            conn.execute("COMMIT")

    return write


WORKLOADS: dict[str, tuple[list[str], Callable[[sqlite3.Connection], Callable[[], None]]]] = {
    "narrow": (["accounts", "orders"], _narrow),
    "large": (["docs"], _large),
}


MODES = ("plain", "triggers", "captured")


def _once(workload: str, mode: str) -> tuple[float, float, float]:
    """One timed run: (the application's seconds, its CPU seconds, the publisher's lock waits)."""
    tables, prepare = WORKLOADS[workload]
    pair = Pair(Path(tempfile.mkdtemp(prefix=f"txrepl-bench-appw-{workload}-")), tables=tables)
    conn = sqlite_source(pair.source_path)
    try:
        write = prepare(conn)
        if mode != "plain":
            pair.start_publisher()
            wait_until(lambda: _installed(pair.source_path, tables), 60, "capture triggers")
        if mode == "triggers":
            pair.stop()  # the triggers stay: their own cost, without the capture's reads
        started, cpu = time.perf_counter(), time.process_time()
        write()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        if mode != "captured" or pair.pub is None:
            return seconds, cpu, 0.0
        return seconds, cpu, _lock_waits(pair.pub.metrics_address)
    finally:
        conn.close()
        pair.stop()


def run(results_dir: Path) -> list[dict[str, Any]]:
    del results_dir
    repeats = _env_int("TXREPL_BENCH_APPW_REPEATS", 3)
    out: list[dict[str, Any]] = []
    with scrubbed_bench_env():
        for workload in WORKLOADS:
            times: dict[str, list[float]] = {m: [] for m in MODES}
            cpus: dict[str, list[float]] = {m: [] for m in MODES}
            waits: list[float] = []
            for _ in range(repeats):
                for mode in MODES:
                    seconds, cpu, lock_waits = _once(workload, mode)
                    times[mode].append(seconds)
                    cpus[mode].append(cpu)
                    if mode == "captured":
                        waits.append(lock_waits)
            median = {m: statistics.median(times[m]) for m in MODES}
            cpu_median = {m: statistics.median(cpus[m]) for m in MODES}
            row: dict[str, Any] = {
                "measure": "app_write_time",
                "workload": workload,
                "repeats": repeats,
                **{f"{m}_s": round(median[m], 2) for m in MODES},
                "ratio": round(median["captured"] / median["plain"], 2),
                "triggers_ratio": round(median["triggers"] / median["plain"], 2),
                **{f"{m}_cpu_s": round(cpu_median[m], 2) for m in MODES},
                "cpu_ratio": round(cpu_median["captured"] / cpu_median["plain"], 2),
                "triggers_cpu_ratio": round(cpu_median["triggers"] / cpu_median["plain"], 2),
                **{f"{m}_runs_s": [round(t, 2) for t in times[m]] for m in MODES},
                "capture_lock_waits": statistics.median(waits),
            }
            print(f"  {row}", flush=True)
            out.append(row)
    return out
