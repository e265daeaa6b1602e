"""Benchmark of SQLite capture's wait and CPU (issue 23; not a test: pytest does not
collect bench_*.py).  publisher/capture/sqlite/wake.py says what is measured against what.

For each way of pacing the capture loop (polling only, as before issue 23's wake-up;
woken by the source's writes with the fallback poll at 5 ms and at 1 s), a child
process runs ``SqliteSource.stream`` into a real log on a real SQLite file (WAL,
``synchronous = NORMAL``, as the W1 bench's source) and this process writes to it:

* ``idle_cpu_pct``: the capture process's CPU (user + system) over ``IDLE_S`` with
  nothing written, in % of one core;
* at ``RATE`` one-row transactions a second for ``LOAD_S``: ``capture`` = the entry's
  build time (its ``commit_time_us``, the capture's clock) - the writer's COMMIT
  returned, per transaction, p50 / p99 ms: the wait for the capture (poll or wake)
  plus its read; the log's append and fsync are the ``durable`` stage, not here;
  ``load_cpu_pct`` and ``txn_per_entry`` (how many transactions a step grouped).

    .venv/bin/python -m tests.bench sqlite_capture
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common.values import decode

IDLE_S = 5.0
LOAD_S = 3.0
RATE = 1000
RUNS = 3
# (name, poll interval s, woken by writes)
MODES = (
    ("poll 5 ms", 0.005, False),  # the default poll_interval_ms, as before the wake-up
    ("wake, poll 5 ms", 0.005, True),  # the default now
    ("wake, poll 1 s", 1.0, True),  # a long fallback: the idle cost with a watch
)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _child(work: str, poll_s: float, watch: bool, loaded: Any, written: Any, out: Any) -> None:
    """The capture process: idle, then loaded until ``written`` has been captured."""
    from publisher.capture.sqlite.source import SqliteSource
    from tests.support.pg_capture import open_pub

    source = SqliteSource(Path(work) / "src.db", poll_interval_s=poll_s, watch=watch)
    pub = open_pub(Path(work) / "logs", "p", ["t"])
    halt = threading.Event()
    thread = threading.Thread(target=source.stream, args=([pub], halt))
    thread.start()
    while pub.log.head < 1:  # the install's schema entry
        time.sleep(0.01)
    time.sleep(0.5)
    c0 = _cpu()
    time.sleep(IDLE_S)
    idle = (_cpu() - c0) / IDLE_S
    head = pub.log.head
    loaded.set()
    c0, t0 = _cpu(), time.monotonic()
    last = written.get()  # the highest capture id once the writer is done
    while pub.position < last:
        time.sleep(0.001)
    load = (_cpu() - c0) / (time.monotonic() - t0)
    halt.set()
    thread.join()
    source.release()
    pub.log.close()
    out.put({"idle": idle, "load": load, "entries": pub.log.head - head})


def _one(base: Path, mode: tuple[str, float, bool]) -> dict[str, Any]:
    from publisher.capture.sqlite.source import SqliteSource
    from publisher.config import PublicationConfig
    from publisher.log import open_log
    from publisher.publication import Publication
    from tests.support.pg_capture import read_entries

    work = Path(tempfile.mkdtemp(prefix="sqlite-capture-", dir=base))
    conn = sqlite3.connect(work / "src.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    SqliteSource(work / "src.db").install("p", "inc", ["t"])
    ctx = mp.get_context("spawn")
    loaded, written, out = ctx.Event(), ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_child, args=(str(work), mode[1], mode[2], loaded, written, out))
    proc.start()
    loaded.wait(120)
    commits: dict[int, float] = {}
    start = time.monotonic()
    n = int(RATE * LOAD_S)
    for i in range(n):
        pause = start + i / RATE - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        conn.execute("INSERT INTO t VALUES (?, 'x')", (i,))
        commits[i] = time.time()
    achieved = n / (time.monotonic() - start)
    written.put(int(conn.execute("SELECT max(id) FROM _txrepl_capture").fetchone()[0]))
    got = out.get(timeout=300)
    proc.join()
    conn.close()
    waits = []
    with open_log(work / "logs" / "p", fsync="always") as log:
        pub = Publication(PublicationConfig(name="p", tables=["t"]), log)
        for e in read_entries(pub):
            for op in e.ops:
                if op.HasField("row"):
                    i = int(decode(op.row.row[0]))  # type: ignore[call-overload]
                    waits.append((e.commit_time_us / 1e6 - commits[i]) * 1000)
    waits.sort()
    return {
        "mode": mode[0],
        "idle_cpu_pct": round(got["idle"] * 100, 2),
        "load_cpu_pct": round(got["load"] * 100, 1),
        "achieved_txn_per_s": round(achieved, 1),
        "txn_per_entry": round(n / max(1, got["entries"]), 2),
        "capture_p50_ms": round(waits[len(waits) // 2], 3),
        "capture_p99_ms": round(waits[int(len(waits) * 0.99)], 3),
    }


def run(results_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-capture-") as tmp:
        for r in range(RUNS):
            for mode in MODES:  # interleaved: the machine's load hits every mode alike
                row = {"run": r + 1, **_one(Path(tmp), mode)}
                print(f"  {row}", flush=True)
                rows.append(row)
    print(f"{'mode':<18}{'idle CPU %':>11}{'load CPU %':>11}{'txn/entry':>10}"
          f"{'capture p50 ms':>16}{'p99 ms':>9}  (medians of {RUNS})")  # fmt: skip
    for name, _, _ in MODES:
        mine = [r for r in rows if r["mode"] == name]

        def med(key: str, mine: list[dict[str, Any]] = mine) -> float:
            return float(statistics.median(r[key] for r in mine))

        print(f"{name:<18}{med('idle_cpu_pct'):>11.2f}{med('load_cpu_pct'):>11.1f}"
              f"{med('txn_per_entry'):>10.2f}{med('capture_p50_ms'):>16.3f}"
              f"{med('capture_p99_ms'):>9.3f}")  # fmt: skip
    return rows
