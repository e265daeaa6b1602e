"""The subscriber's Spark on a real standalone cluster (master + two workers on loopback).

Each test runs a real publisher and a real subscriber process whose ``spark.master``
is the session's cluster (tests/fixtures/spark_cluster.py), so every batch's net
effect is computed by executors on the workers, not in the driver.  The machine has
two cores shared with other test runs: the tests are few, and their timeouts are
generous because a Spark start-up under load takes tens of seconds.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.jvm import QUICK_JVM
from tests.fixtures.spark_cluster import SparkCluster
from tests.support.harness import Daemon, Pair, wait_until
from tests.support.ledger import (
    LEDGER_COLUMNS,
    ledger_source,
    ledger_txns,
    wait_equal,
)
from tests.support.workload import (
    W1,
    W1_COLUMNS,
    diff_tables,
    run_sqlite,
    sqlite_source,
    w1_checksum,
)

pytestmark = pytest.mark.spark

APP_NAME = "txrepl-subscriber"
# These batches are small: without this their net effect would be computed in the
# driver, and the cluster would never see a job.
SPARK_ALWAYS = {"spark_min_rows": 0}


def cluster_spark(cluster: SparkCluster, **conf: str) -> dict[str, Any]:
    """``[spark]`` of a subscriber that runs on ``cluster``.

    Executors get 512 MB (the workers offer 1 GB each); conf keys are quoted because
    the harness writes inline TOML tables, where a bare ``spark.x`` is a dotted key.
    """
    settings = {
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.executor.extraJavaOptions": QUICK_JVM,
        **conf,
    }
    return {
        "master": cluster.url,
        "conf": {f'"{k}"': v for k, v in settings.items()},
        "shuffle_partitions": 2,
    }


def start_subscriber(pair: Pair, timeout: float = 300.0) -> Daemon:
    """``pair.start_subscriber()`` with room for a Spark start-up on a loaded machine."""
    assert pair.pub is not None
    pair.sub = Daemon(
        "subscriber",
        pair.write_subscriber_config(pair.pub.address),
        pair.workdir / "subscriber" / "subscriber.addr",
        pair.workdir / "subscriber.log",
        env=pair.env,
    ).start(timeout)
    return pair.sub


def paced_ledger(src: sqlite3.Connection, start: int, count: int, group: int = 10) -> None:
    """Ledger transactions in small groups, so that capture makes many small entries.

    Capture puts everything committed since its last poll into one entry; written
    in one go, thousands of transactions would make a handful of entries and one
    batch, leaving no "middle of a batch" to kill a worker in.
    """
    for first in range(start, start + count, group):
        ledger_txns(src, first, min(group, start + count - first))
        time.sleep(0.03)


def our_app(cluster: SparkCluster) -> dict[str, Any] | None:
    return next((a for a in cluster.active_apps() if a.get("name") == APP_NAME), None)


class LevelWatcher(threading.Thread):
    """Reads (level, counter.n, count(ledger)) from the SQLite target in one snapshot, often.

    Every ledger transaction bumps ``counter.n`` and inserts one ledger row, so in any
    committed state ``n == rows``; and since the level commits with its rows, one
    level always shows one ``n``, and both only grow.
    """

    def __init__(self, target: Path, subscription: str) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.subscription = subscription
        self.samples: list[tuple[int, int, int]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        conn: sqlite3.Connection | None = None
        while not self.stop_event.is_set():
            try:
                if conn is None:
                    conn = sqlite3.connect(str(self.target), timeout=5, isolation_level=None)
                conn.execute("BEGIN")
                try:
                    (level,) = conn.execute(
                        "SELECT level FROM txrepl_subscriptions WHERE subscription = ?",
                        (self.subscription,),
                    ).fetchone()
                    (n,) = conn.execute("SELECT n FROM counter WHERE id = 1").fetchone()
                    (rows,) = conn.execute("SELECT count(*) FROM ledger").fetchone()
                finally:
                    conn.execute("COMMIT")
                self.samples.append((int(level), int(n), int(rows)))
            except (sqlite3.Error, TypeError):
                pass  # not created yet, or locked for a moment
            time.sleep(0.05)
        if conn is not None:
            conn.close()

    def stop(self) -> list[tuple[int, int, int]]:
        self.stop_event.set()
        self.join(10)
        return self.samples

    def check(self) -> None:
        samples = list(self.samples)
        assert samples, "the watcher never read the target"
        seen: dict[int, int] = {}
        last = (0, 0)
        for level, n, rows in samples:
            assert n == rows, f"half a transaction visible: level {level}, n {n}, rows {rows}"
            assert seen.setdefault(level, n) == n, f"level {level} showed n {seen[level]} and {n}"
            assert (level, n) >= last, f"went back: {last} -> {(level, n)}"
            assert n >= last[1], f"n went back: {last} -> {(level, n)}"
            last = (level, n)


def test_catch_up_through_cluster(tmp_path: Path, spark_cluster_healthy: SparkCluster) -> None:
    """A W1 backlog applied by a subscriber whose Spark is the cluster: target = source."""
    cluster = spark_cluster_healthy
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders"],
        subscriber_extra={
            "spark": cluster_spark(cluster),
            "batch": {"max_entries": 500},
            "apply": SPARK_ALWAYS,
        },
    )
    src = sqlite_source(pair.source_path)
    w1 = W1(accounts=300)
    run_sqlite(src, w1.transactions(1))
    try:
        pair.start_publisher()
        run_sqlite(src, w1.transactions(1500))
        start_subscriber(pair)
        # the session starts beside the subscriptions (subscriber/apply/lazy.py)
        wait_until(lambda: our_app(cluster) is not None, 120, f"{APP_NAME} on the cluster")
        app = our_app(cluster)
        assert app is not None, f"no {APP_NAME} on the cluster: {cluster.active_apps()}"
        assert app["cores"] >= 1, app  # executors were granted on the workers
        pair.wait_caught_up(timeout=300)
        run_sqlite(src, w1.transactions(200))
        wait_equal(src, pair.target_path, W1_COLUMNS, timeout=180)
        dst = sqlite3.connect(str(pair.target_path))
        assert w1_checksum(src) == w1_checksum(dst)
        dst.close()
        # The executors ran tasks: each left its stderr under the workers' work dir.
        assert list((cluster.base / "work").glob(f"{app['id']}/*/stderr")), app["id"]
    finally:
        pair.stop()
        src.close()


@pytest.mark.postgres
def test_catch_up_into_postgres_through_cluster(
    tmp_path: Path, spark_cluster_healthy: SparkCluster, pg_db: str
) -> None:
    """A W1 backlog into PostgreSQL through the cluster; JDBC staging asked for every batch.

    ``apply.jdbc_min_rows = 1`` stages every rows step through Spark's JDBC writer:
    the cluster's executors connect to the target themselves, with the PostgreSQL
    driver shipped through ``spark.jars``.  Target = source, and the staging tables
    the executors filled are there (empty) while the subscriber runs.
    """
    import psycopg

    cluster = spark_cluster_healthy
    spark = cluster_spark(cluster)
    spark["jars"] = ["/usr/share/java/postgresql.jar"]
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders"],
        subscriber_extra={
            "target": pg_db,
            "spark": spark,
            "batch": {"max_entries": 500},
            "apply": {"jdbc_min_rows": 1, **SPARK_ALWAYS},
        },
    )
    src = sqlite_source(pair.source_path)
    w1 = W1(accounts=300)
    run_sqlite(src, w1.transactions(1501))
    try:
        pair.start_publisher()
        start_subscriber(pair)
        wait_until(lambda: our_app(cluster) is not None, 120, f"{APP_NAME} on the cluster")
        pair.wait_caught_up(timeout=300)
        with psycopg.connect(pg_db, autocommit=True) as dst:
            problems = diff_tables(src, dst, W1_COLUMNS)
            assert not problems, "\n".join(problems)
            assert w1_checksum(src) == w1_checksum(dst)
            stages = dst.execute(
                "SELECT relname FROM pg_class WHERE relname LIKE 'txrepl\\_jdbc\\_%'"
            ).fetchall()
            assert stages, "no JDBC staging table: the batches were not staged by Spark"
            for (name,) in stages:
                assert dst.execute(f'SELECT count(*) FROM "{name}"').fetchone() == (0,)
    finally:
        pair.stop()
        src.close()


def test_workers_and_master_lost_mid_catch_up(
    tmp_path: Path, spark_cluster_healthy: SparkCluster
) -> None:
    """Kill a worker mid-batch, then the other, then the master: nothing half-applied, converges.

    1. One worker (and its executor) SIGKILLed while batches run: Spark re-runs the
       lost tasks on the other worker's executor.
    2. The other one SIGKILLed too: no executor is left, the batch in flight waits
       (the level does not move); restarting the workers lets it finish.
    3. The master SIGKILLed: the application keeps its executors and goes on
       applying; the master restarted on its port recovers the application from its
       recovery directory.
    Throughout, a watcher checks that the level never moves without its rows.
    """
    cluster = spark_cluster_healthy
    pair = Pair(
        tmp_path,
        tables=["counter", "ledger"],
        # Small batches (the publisher sends 10 entries a message, the subscriber
        # applies at most 10 at a time), so a fault lands in the middle of one.
        publication_extra={"batch_entries": 10},
        subscriber_extra={
            "spark": cluster_spark(cluster),
            "batch": {"max_entries": 10},
            "apply": SPARK_ALWAYS,
        },
    )
    src = ledger_source(pair.source_path)
    watcher = LevelWatcher(pair.target_path, f"{pair.publisher_name}.{pair.publication}")
    try:
        pair.start_publisher()
        paced_ledger(src, 1, 3000)
        start_subscriber(pair)
        watcher.start()
        wait_until(lambda: pair.status().level > 0, 300, "a first applied batch")

        # 1. One worker lost in the middle of the catch-up.
        cluster.kill_worker(0)
        level_at_kill = pair.status().level
        wait_until(lambda: pair.status().level > level_at_kill, 300, "progress on the other worker")

        # 2. No worker at all: the batch in flight waits, committing nothing.
        cluster.kill_worker(1)
        paced_ledger(src, 3001, 500)
        time.sleep(3)  # let a batch that already had its rows commit
        frozen = pair.status().level
        time.sleep(5)
        st = pair.status()
        assert st.level == frozen, "a batch committed without any executor"
        assert st.state in ("syncing", "in_sync"), (st.state, st.last_error)
        cluster.start_worker(0)
        cluster.start_worker(1)
        cluster.wait_workers(timeout=180)
        wait_until(lambda: pair.status().level > frozen, 300, "progress after the workers return")

        # 3. The master lost while the subscriber applies, then back on its port.
        cluster.kill_master()
        paced_ledger(src, 3501, 300)
        before = pair.status().level
        wait_until(lambda: pair.status().level > before, 300, "progress without a master")
        cluster.start_master()
        cluster.wait_workers(timeout=180)
        wait_until(lambda: our_app(cluster) is not None, 120, "the app recovered by the master")
        ledger_txns(src, 3801, 200)

        wait_equal(src, pair.target_path, LEDGER_COLUMNS, timeout=300)
        pair.wait_caught_up(timeout=120)
        with contextlib.closing(sqlite3.connect(str(pair.target_path))) as dst:
            (n,) = dst.execute("SELECT n FROM counter WHERE id = 1").fetchone()
            (rows,) = dst.execute("SELECT count(*) FROM ledger").fetchone()
        assert n == rows == 4000
        watcher.stop()
        watcher.check()
        # Spark absorbed every fault: the subscription never had to reconnect.
        st = pair.status()
        assert st.sessions == 1, [(t.state, t.reason) for t in st.timeline]
        assert "error" not in [t.state for t in st.timeline], st.timeline
    finally:
        watcher.stop()
        pair.stop()
        src.close()
