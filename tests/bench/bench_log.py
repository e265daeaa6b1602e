"""Benchmark of publisher.log (not a test: pytest does not collect bench_*.py).

Measures durable appends/s under fsync="always" with group commit, at 1, 8 and 64
concurrent appender threads (each appending one entry per call), with 200 B and 4 KiB
entries; and sequential read MB/s right after a fresh open and with a warm log.  The
page cache cannot be dropped without privileges, so "fresh open" means a newly opened
Log (new mappings, index and recovery done) over files the OS may still cache.

Every figure is the median of 3 runs.  Run with::

    .venv/bin/python -m tests.bench.bench_log [results_dir]

``run(results_dir)`` prints a table, writes ``bench_log.json`` there and returns rows.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from publisher.log import open_log

RUNS = 3
APPEND_SECONDS = 2.0
READ_BYTES = 256 << 20


def _append_rate(directory: Path, appenders: int, size: int, batch: int = 1) -> float:
    """Durable entries/s with ``appenders`` threads each appending ``batch`` entries a call."""
    body = [b"x" * size] * batch
    with open_log(directory, fsync="always") as log:
        stop = threading.Event()
        counts = [0] * appenders
        barrier = threading.Barrier(appenders + 1)

        def worker(i: int) -> None:
            barrier.wait()
            n = 0
            while not stop.is_set():
                log.append(body)
                n += batch
            counts[i] = n

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(appenders)]
        for t in threads:
            t.start()
        barrier.wait()
        started = time.perf_counter()
        time.sleep(APPEND_SECONDS)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        assert log.head == sum(counts)
    return sum(counts) / elapsed


def _read_all(directory: Path) -> tuple[float, float, float]:
    """(MB/s fresh open, MB/s warm, seconds to open) reading the whole log sequentially."""
    t0 = time.perf_counter()
    log = open_log(directory, verify="tail")
    opened = time.perf_counter() - t0
    rates = []
    try:
        for _ in range(2):  # first pass right after opening, second pass warm
            total = 0
            seq = log.first_seq
            started = time.perf_counter()
            while seq <= log.head:
                batch = log.read(seq, max_entries=1000, max_bytes=4 << 20)
                total += sum(len(p) for p in batch)
                seq += len(batch)
            rates.append(total / (time.perf_counter() - started) / 1e6)
    finally:
        log.close()
    return rates[0], rates[1], opened


def run(results_dir: Path) -> list[dict[str, Any]]:
    """Run the benchmark; print a table; write and return the result rows."""
    results_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=results_dir, prefix="bench-log-") as tmp:
        root = Path(tmp)
        n = 0
        for size in (200, 4096):
            for appenders in (1, 8, 64):
                samples = []
                for _ in range(RUNS):
                    n += 1
                    samples.append(_append_rate(root / f"a{n}", appenders, size))
                rate = statistics.median(samples)
                rows.append(
                    {
                        "bench": "append_always_group_commit",
                        "appenders": appenders,
                        "entry_bytes": size,
                        "entries_per_s": round(rate),
                        "mb_per_s": round(rate * size / 1e6, 1),
                    }
                )
        for size in (200, 4096):
            n += 1
            samples = [_append_rate(root / f"b{n}-{i}", 1, size, batch=64) for i in range(RUNS)]
            rate = statistics.median(samples)
            rows.append(
                {
                    "bench": "append_always_batch64",
                    "appenders": 1,
                    "entry_bytes": size,
                    "entries_per_s": round(rate),
                    "mb_per_s": round(rate * size / 1e6, 1),
                }
            )
        read_dir = root / "read"
        size = 4096
        with open_log(read_dir, fsync="always") as log:
            batch = [b"r" * size] * 256
            while log.size_bytes < READ_BYTES:
                log.append(batch)
        fresh, warm, opened = zip(*(_read_all(read_dir) for _ in range(RUNS)), strict=True)
        rows.append(
            {
                "bench": "read_sequential",
                "entry_bytes": size,
                "log_mb": round(READ_BYTES / 1e6),
                "fresh_open_mb_per_s": round(statistics.median(fresh)),
                "warm_mb_per_s": round(statistics.median(warm)),
                "open_s": round(statistics.median(opened), 3),
            }
        )
    _print(rows)
    (results_dir / "bench_log.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"publisher.log benchmark (median of {RUNS} runs)")
    print(f"{'appenders':>9} {'entry':>6} {'entries/s':>11} {'MB/s':>7}   (fsync=always)")
    for r in rows:
        if r["bench"].startswith("append_always"):
            note = "  (64 entries per append call)" if r["bench"] == "append_always_batch64" else ""
            print(
                f"{r['appenders']:>9} {r['entry_bytes']:>6} "
                f"{r['entries_per_s']:>11,} {r['mb_per_s']:>7}{note}"
            )
    for r in rows:
        if r["bench"] == "read_sequential":
            print(
                f"sequential read of {r['log_mb']} MB ({r['entry_bytes']} B entries): "
                f"fresh open {r['fresh_open_mb_per_s']} MB/s, warm {r['warm_mb_per_s']} MB/s, "
                f"open {r['open_s']} s"
            )


if __name__ == "__main__":
    run(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench-results"))
