"""Fan-out: one publisher, 1, 10 and 50 subscribers in sync; per-subscriber rate and lag.

The subscribers are raw in-process Sync clients (tests/support/feedclient.py) hosted by one
child process (50 Spark JVMs do not fit two cores).  Each client parses every entry it
receives, checks seqs have no gap, acks, and records when W1's every-100th order
arrives; it does not write a database, so this measures the publisher and the wire.

Per fan-out N (fresh subscriber names, so every client starts at level 0):

catch-up   all N clients sync a backlog of ``TXREPL_BENCH_FANOUT_BACKLOG`` W1
           transactions (default 20000) at once; entries/s per subscriber
in sync    the source then runs ``TXREPL_BENCH_FANOUT_LAG_T`` transactions (default
           5000) at ``TXREPL_BENCH_FANOUT_RATE`` txn/s (default 500); lag per
           subscriber = arrival of every 100th transaction minus its source commit

    .venv/bin/python -m tests.bench fanout
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common.rpc import txrepl_pb2 as pb
from common.values import decode
from tests.bench.bench_w1 import (
    MARK_EVERY,
    Source,
    _env_int,
    _percentile,
    run_stream,
    scrubbed_bench_env,
)
from tests.support.feedclient import RawSubscriber
from tests.support.harness import Pair, wait_until
from tests.support.reference import ReferenceTarget
from tests.support.workload import W1, sqlite_source

FANOUTS = (1, 10, 50)


class MarkerTarget(ReferenceTarget):
    """Counts entries and notes when each every-100th order arrives; applies nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.entries = 0
        self.arrived: dict[int, float] = {}

    def apply_all(self, first_seq: int, entries: Any) -> None:
        assert first_seq == self.level + 1, f"gap: {first_seq} after {self.level}"
        now = time.time()
        n = 0
        for e in entries:
            n += 1
            for op in e.ops:
                if op.row.table == "orders" and op.row.op == pb.ROW_OP_INSERT and op.row.row:
                    oid = decode(op.row.row[0])
                    if isinstance(oid, int) and oid % MARK_EVERY == 0:
                        self.arrived[oid] = now
        self.entries += n
        self.level = first_seq + n - 1


async def _host(address: str, n: int, tag: str, head: int, events: Any, out: Any) -> None:
    clients = [RawSubscriber(address, f"fan{tag}-{i}", target=MarkerTarget()) for i in range(n)]
    started = time.monotonic()
    for c in clients:
        await c.start()
    done: dict[int, float] = {}
    while len(done) < n:
        for i, c in enumerate(clients):
            if i not in done and c.level >= head:
                done[i] = time.monotonic() - started
            if c.ended.is_set():
                raise RuntimeError(f"{c.name} ended: {c.code} {c.details}")
        await asyncio.sleep(0.005)
    out.put(("caught_up", [done[i] for i in range(n)]))
    while not events.is_set():
        await asyncio.sleep(0.05)
    await asyncio.sleep(2.0)  # the tail of the stream
    result = [
        {"entries": c.target.entries, "arrived": c.target.arrived}  # type: ignore[attr-defined]
        for c in clients
    ]
    for c in clients:
        await c.close()
    out.put(("done", result))


def _host_main(address: str, n: int, tag: str, head: int, events: Any, out: Any) -> None:
    asyncio.run(_host(address, n, tag, head, events, out))


def run(results_dir: Path) -> list[dict[str, Any]]:
    backlog = _env_int("TXREPL_BENCH_FANOUT_BACKLOG", 20_000)
    lag_t = _env_int("TXREPL_BENCH_FANOUT_LAG_T", 5_000)
    rate = _env_int("TXREPL_BENCH_FANOUT_RATE", 500)
    with scrubbed_bench_env():
        return _run(results_dir, backlog, lag_t, rate)


def _run(results_dir: Path, backlog: int, lag_t: int, rate: int) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="txrepl-bench-fanout-"))
    pair = Pair(work, tables=["accounts", "orders"])
    conn = sqlite_source(pair.source_path)
    source = Source("sqlite", conn)
    w1 = W1()
    rows: list[dict[str, Any]] = []
    next_id = 0
    try:
        pair.start_publisher()
        run_stream(source, list(w1.transactions(backlog + 1)), 0, None)
        next_id = backlog + 1
        wait_until(
            lambda: conn.execute("SELECT count(*) FROM _txrepl_capture").fetchone()[0] == 0,
            600,
            "capture to drain",
        )
        ctx = mp.get_context("spawn")
        print(f"fan-out: backlog {backlog} txns, then {lag_t} txns at {rate} txn/s")
        for n in FANOUTS:
            head = pair.head()
            events, out = ctx.Event(), ctx.Queue()
            assert pair.pub is not None
            proc = ctx.Process(
                target=_host_main, args=(pair.pub.address, n, str(n), head, events, out)
            )
            proc.start()
            kind, catch = out.get(timeout=1800)
            assert kind == "caught_up"
            txns = list(w1.transactions(lag_t))
            commits, achieved = run_stream(source, txns, next_id, rate)
            next_id += lag_t
            events.set()
            kind, result = out.get(timeout=600)
            proc.join(30)
            per_sub = []
            for r in result:
                lags = [(r["arrived"][m] - commits[m]) * 1000 for m in commits if m in r["arrived"]]
                per_sub.append(
                    {
                        "p50_ms": _percentile(lags, 50),
                        "p99_ms": _percentile(lags, 99),
                        "max_ms": max(lags) if lags else float("nan"),
                        "seen": len(lags),
                    }
                )
            rates = [head / s for s in catch]
            txn_rates = [(backlog + 1) / s for s in catch]
            row = {
                "measure": "fanout",
                "subscribers": n,
                "backlog_entries": head,
                "catch_up_entries_per_s_per_sub": {
                    "median": round(statistics.median(rates), 1),
                    "min": round(min(rates), 1),
                    "max": round(max(rates), 1),
                },
                "catch_up_entries_per_s_total": round(n * head / max(catch), 1),
                # capture groups transactions into entries: the backlog in W1 transactions
                "catch_up_txn_per_s_per_sub": round(statistics.median(txn_rates), 1),
                "rate": rate,
                "achieved_txn_per_s": round(achieved, 1),
                "markers": len(commits),
                "lag_p50_ms_median": round(statistics.median(p["p50_ms"] for p in per_sub), 2),
                "lag_p99_ms_worst": round(max(p["p99_ms"] for p in per_sub), 2),
                "lag_max_ms": round(max(p["max_ms"] for p in per_sub), 2),
                "markers_seen_min": min(p["seen"] for p in per_sub),
            }
            rows.append(row)
            print(
                f"  {n:3d} subscribers: catch-up "
                f"{row['catch_up_entries_per_s_per_sub']['median']:,.0f} entries/s "
                f"({row['catch_up_txn_per_s_per_sub']:,.0f} txn/s) each "
                f"({row['catch_up_entries_per_s_total']:,.0f} total); in sync at "
                f"{rate} txn/s: lag p50 {row['lag_p50_ms_median']} ms, worst p99 "
                f"{row['lag_p99_ms_worst']} ms, max {row['lag_max_ms']} ms"
            )
    finally:
        pair.stop()
        conn.close()
    _plot(results_dir, rows)
    return rows


def _plot(results_dir: Path, rows: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if not rows:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ns = [str(r["subscribers"]) for r in rows]
    a.bar(ns, [r["catch_up_entries_per_s_per_sub"]["median"] for r in rows])
    a.set_title("catch-up entries/s per subscriber")
    a.set_xlabel("subscribers")
    b.plot(ns, [r["lag_p50_ms_median"] for r in rows], marker="o", label="p50 (median sub)")
    b.plot(ns, [r["lag_p99_ms_worst"] for r in rows], marker="o", label="p99 (worst sub)")
    b.set_yscale("log")
    b.set_title("in-sync lag (ms)")
    b.set_xlabel("subscribers")
    b.legend()
    fig.tight_layout()
    results_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(results_dir / "fanout.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import sys

    run(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="bench-fanout-")))
