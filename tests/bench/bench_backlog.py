"""A large SQLite backlog written while the daemons are down: time to in sync, peak RSS.

A document store (issue 21, "Done when" a): a SQLite source of ``DOCS`` documents
with 100 KB text values.  Publisher and subscriber start once (capture installed,
the subscription in sync on one row) and stop; the application then writes
``TXREPL_BENCH_BACKLOG_MB`` (default 1000: 1 GB) MB of values, one document per
transaction: ``DOCS`` inserts, then updates of them in turn.  Publisher and
subscriber start again on that backlog; the bench times start → the target holds
what the source holds (count and sum of revisions) → the subscription ``in_sync``
at the publication's head, and samples every 0.25 s, from each daemon's spawn, the
VmRSS and RssAnon of the publisher and the subscriber and the VmRSS of the
subscriber's JVM (tests/support/rss.py).  Goal: each Python process under 512 MiB,
the JVM under its heap (``spark.driver.memory``, Spark's default 1g).

    TXREPL_BENCH_BACKLOG_MB=256 .venv/bin/python -m tests.bench backlog
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.bench_w1 import _env_int, scrubbed_bench_env
from tests.support.harness import Pair, wait_until
from tests.support.rss import start_sampled

VALUE_BYTES = 100_000
DOCS = 1_000


def _value() -> str:
    return os.urandom(VALUE_BYTES // 2).hex()  # 100 KB of text that does not compress


def _state(path: Path) -> tuple[int, int] | None:
    """(documents, sum of their revisions) in a source or target file."""
    try:
        with sqlite3.connect(str(path), timeout=5) as conn:
            n, revs = conn.execute("SELECT count(*), coalesce(sum(rev), 0) FROM docs").fetchone()
            return int(n), int(revs)
    except sqlite3.Error:
        return None


def _write_backlog(src: sqlite3.Connection, mb: int) -> int:
    """``mb`` MB of 100 KB values, one document per transaction; returns the writes."""
    writes = mb * 10**6 // VALUE_BYTES
    for i in range(1, writes + 1):
        doc = (i - 1) % DOCS + 1
        src.execute(
            "INSERT INTO docs VALUES (?, ?, ?) ON CONFLICT(id) DO UPDATE"
            " SET rev = excluded.rev, body = excluded.body",
            (doc, i, _value()),
        )
    return writes


def backlog(mb: int, batch: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run; ``batch``: the subscriber's ``[batch]`` keys (default: its defaults)."""
    base = Path(tempfile.mkdtemp(prefix="txrepl-bench-backlog-"))
    pair = Pair(base, tables=["docs"], subscriber_extra={"batch": batch} if batch else {})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("PRAGMA journal_mode=WAL")
    src.execute("PRAGMA synchronous=NORMAL")
    src.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, rev INTEGER, body TEXT)")
    src.execute("INSERT INTO docs VALUES (0, 0, 'first')")
    try:
        first = pair.start_publisher()
        pair.sub = pair.subscriber_daemon().start(timeout=600)
        pair.wait_caught_up(timeout=600)
        pair.sub.stop()
        first.stop()

        started = time.perf_counter()
        writes = _write_backlog(src, mb)
        write_s = time.perf_counter() - started
        (captured,) = src.execute(
            "SELECT coalesce(sum(length(v)), 0) FROM _txrepl_capture"
        ).fetchone()
        expected = _state(pair.source_path)

        started = time.perf_counter()
        pair.pub = pair.publisher_daemon()
        pub = start_sampled(pair.pub, timeout=600)
        pair.sub = pair.subscriber_daemon()
        sub = start_sampled(pair.sub, timeout=600, with_children=True)
        wait_until(lambda: _state(pair.target_path) == expected, 7200, "the target to match")
        matched = time.perf_counter()
        head = pair.wait_caught_up(timeout=600)
        in_sync = time.perf_counter()
        pub.stop()
        sub.stop()
        log_bytes = sum(p.stat().st_size for p in (base / "publisher" / "publications").rglob("*"))
    finally:
        pair.stop()
        src.close()
        shutil.rmtree(base, ignore_errors=True)
    row = {
        "measure": "backlog",
        "backlog_mb": mb,
        "batch": batch or "default",
        "writes": writes,
        "capture_table_mib": round(captured / 2**20, 1),
        "log_mib": round(log_bytes / 2**20, 1),
        "entries": head,
        "app_write_s": round(write_s, 1),
        "start_to_target_matches_s": round(matched - started, 1),
        "start_to_in_sync_s": round(in_sync - started, 1),
        "publisher_rss_peak_mib": pub.peak_mib(1),
        "publisher_anon_peak_mib": pub.peak_mib(3),
        "subscriber_rss_peak_mib": sub.peak_mib(1),
        "subscriber_anon_peak_mib": sub.peak_mib(3),
        "jvm_rss_peak_mib": sub.peak_mib(2),
        # (s since the subscriber's spawn, its RssAnon MiB, its JVM's VmRSS MiB)
        "subscriber_series": [
            (round(t, 1), round(anon / 1024), round(jvm / 1024))
            for t, _, jvm, anon in sub.samples[:: max(1, len(sub.samples) // 40)]
        ],
    }
    print(f"  {row}", flush=True)
    return row


def run(results_dir: Path) -> list[dict[str, Any]]:
    del results_dir
    mb = _env_int("TXREPL_BENCH_BACKLOG_MB", 1000)
    batch_bytes = _env_int("TXREPL_BENCH_BACKLOG_BATCH_BYTES", 0)
    with scrubbed_bench_env():
        return [backlog(mb, {"max_bytes": batch_bytes} if batch_bytes else None)]


if __name__ == "__main__":  # pragma: no cover
    print(run(Path(os.getcwd())))
