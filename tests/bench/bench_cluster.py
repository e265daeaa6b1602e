"""W1 catch-up with the subscriber's Spark on ``local[2]`` and on a standalone cluster.

Both configurations run the same W1 stream (tests/support/workload.py) through the same real
publisher and subscriber processes into SQLite, measured by ``bench_w1.catch_up``
(apply time from the first ``syncing`` state until the last transaction is visible
on the target; Spark's start-up reported apart).  Only ``[spark]`` differs:

``local[2]``          the driver's JVM runs the tasks (two threads)
``standalone 2x1``    a master and two workers (1 core, 1 GB each) on 127.0.0.1,
                      started from the installed pyspark (tests/fixtures/spark_cluster.py);
                      executors of 512 MB, one per worker

On one 2-core machine the cluster cannot be faster: the same two cores now also run
a master, two worker daemons and two executor JVMs, and every batch crosses process
boundaries (Arrow batches shipped to executors, results collected back) instead of
staying in one JVM.  The ratio measures the **overhead of the cluster path**, not a
speed-up; the speed-up comes from executors on other machines, for batches big
enough to use them.

Runs alternate (local, cluster, cluster, local, ...) with the idle cluster up all the
time, so that load from other work on the machine hits both alike.

Environment: ``TXREPL_BENCH_T`` (default 10000 here, smaller than bench_w1's
100000), ``TXREPL_BENCH_RUNS`` (default 2).

    .venv/bin/python -m tests.bench cluster
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.bench_w1 import (
    Source,
    TxreplSqlite,
    _env_int,
    catch_up,
    generate,
    scrubbed_bench_env,
    stream_counts,
)
from tests.fixtures.spark_cluster import spark_cluster_available, start_spark_cluster
from tests.support.harness import Daemon, wait_until

NOTE = (
    "one 2-core machine: the standalone cluster shares the same cores with its master, "
    "workers and executors, so this shows the overhead of the cluster path, not a speed-up"
)


class SparkRig(TxreplSqlite):
    """bench_w1's SQLite rig with a given ``[spark]`` section for the subscriber."""

    def __init__(self, base: Path, name: str, spark: dict[str, Any]) -> None:
        super().__init__(base)
        self.name = name
        self.spark = spark

    def setup(self, run: int) -> Source:
        source = super().setup(run)
        assert self.pair is not None
        self.pair.subscriber_extra = {"spark": self.spark}
        return source

    def start_subscriber(self) -> tuple[float, float]:
        pair = self.pair
        assert pair is not None
        assert pair.pub is not None
        launched = time.time()
        # Room for a Spark start-up on a busy machine (the harness allows 90 s).
        pair.sub = Daemon(
            "subscriber",
            pair.write_subscriber_config(pair.pub.address),
            pair.workdir / "subscriber" / "subscriber.addr",
            pair.workdir / "subscriber.log",
            env=pair.env,
        ).start(300)

        def syncing() -> bool:
            st = pair.status()
            return st.state == "in_sync" or any(t.state == "syncing" for t in st.timeline)

        wait_until(syncing, 300, "the subscriber to start syncing")
        first = next(
            (t.at_us / 1e6 for t in pair.status().timeline if t.state == "syncing"),
            time.time(),
        )
        return first - launched, first


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 3) if rows else float("nan")


def run(results_dir: Path) -> list[dict[str, Any]]:
    t = _env_int("TXREPL_BENCH_T", 10_000)
    runs = _env_int("TXREPL_BENCH_RUNS", 2)
    with scrubbed_bench_env():
        return _run(t, runs, results_dir)


def _run(t: int, runs: int, results_dir: Path) -> list[dict[str, Any]]:
    results_dir.mkdir(parents=True, exist_ok=True)
    reason = spark_cluster_available()
    if reason is not None:
        print(f"skipped: {reason}")
        return [{"system": "standalone", "measure": "catch_up", "skipped": reason}]
    txns = generate(t + 1)
    counts = stream_counts(txns)
    print(f"W1 catch-up, T={t} ({counts['row_changes']} row changes), {runs} runs each; {NOTE}")
    base = Path(tempfile.mkdtemp(prefix="txrepl-bench-cluster-"))
    rows: list[dict[str, Any]] = []
    by_system: dict[str, list[dict[str, Any]]] = {}

    def measure(rig: SparkRig, run_no: int) -> None:
        row = {**catch_up(rig, txns, counts, run_no), "master": rig.spark["master"]}
        print(
            f"  {rig.name} run {run_no}: {row['row_changes_per_s']:,.0f} rows/s "
            f"({row['apply_s']:.2f}s apply, {row['startup_s']:.1f}s start-up), "
            f"checksum {'ok' if row['checksum_ok'] else 'MISMATCH'}",
            flush=True,
        )
        rows.append(row)
        by_system.setdefault(rig.name, []).append(row)

    local = "local[2]"
    cluster_name = "standalone 2x1"
    with start_spark_cluster(workers=2, worker_cores=1, worker_memory="1g") as cluster:
        spark = {
            "master": cluster.url,
            "conf": {'"spark.executor.memory"': "512m", '"spark.cores.max"': "2"},
        }
        rigs = [SparkRig(base, local, {"master": "local[2]"}), SparkRig(base, cluster_name, spark)]
        # Interleaved (the idle cluster stays up during local runs), so that a change in
        # the machine's load from other work hits both configurations alike.
        for run_no in range(1, runs + 1):
            for rig in rigs if run_no % 2 else rigs[::-1]:
                measure(rig, run_no)

    summary: dict[str, dict[str, float]] = {}
    for name, got in by_system.items():
        summary[name] = {
            key: _median(got, key)
            for key in ("apply_s", "startup_s", "total_s", "row_changes_per_s", "txn_per_s")
        }
    a, b = summary.get(local), summary.get(cluster_name)
    ratio = round(b["apply_s"] / a["apply_s"], 2) if a and b else float("nan")
    print(f"\nW1 catch-up, T={t}, median of {runs}:  ({NOTE})")
    print(f"{'':24}{'apply s':>10}{'rows/s':>12}{'start-up s':>12}{'total s':>10}")
    for name, s in summary.items():
        print(
            f"{name:24}{s['apply_s']:>10.2f}{s['row_changes_per_s']:>12,.0f}"
            f"{s['startup_s']:>12.1f}{s['total_s']:>10.1f}"
        )
    print(f"cluster apply time / local[2] apply time: {ratio}x")
    rows.append(
        {
            "system": "summary",
            "measure": "catch_up",
            "t": t,
            "runs": runs,
            "medians": summary,
            "cluster_over_local_apply": ratio,
            "note": NOTE,
        }
    )
    return rows
