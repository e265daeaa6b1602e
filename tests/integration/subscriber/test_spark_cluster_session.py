"""``spark_status`` and ``ensure_spark_alive`` against the standalone test cluster.

The driver runs in a child process: one process holds one SparkContext, and this
run's session-scoped local session may already live in the test process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.spark_cluster import SparkCluster
from tests.support.harness import ROOT, wait_until

pytestmark = pytest.mark.spark

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from subscriber.apply.session import (
        SparkSettings, create_spark_session, ensure_spark_alive, spark_status)

    def say(**kw):
        print(json.dumps(kw), flush=True)

    settings = SparkSettings(
        master=sys.argv[1], app_name="txrepl-status-test",
        conf={"spark.executor.memory": "512m", "spark.cores.max": "2"})
    spark = create_spark_session(settings)
    deadline = time.monotonic() + 180
    while spark_status(spark) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    say(step="started", status=spark_status(spark), n=spark.range(100).count())
    sys.stdin.readline()  # the test kills the workers meanwhile
    deadline = time.monotonic() + 120
    while spark_status(spark) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    say(step="no workers", status=spark_status(spark))
    sys.stdin.readline()  # the workers are back
    spark.stop()
    say(step="stopped", status=spark_status(spark))
    again = ensure_spark_alive(spark, settings)
    deadline = time.monotonic() + 180
    while spark_status(again) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    say(step="recreated", same=again is spark, status=spark_status(again),
        n=again.range(100).count(), kept=ensure_spark_alive(again, settings) is again)
    again.stop()
    """
)


def test_status_names_missing_executors_and_a_stopped_context_is_replaced(
    tmp_path: Path, spark_cluster_healthy: SparkCluster
) -> None:
    """No executor: a reason naming the master; stopped: replaced by a working session."""
    cluster = spark_cluster_healthy
    log = open(tmp_path / "child.log", "wb")  # noqa: SIM115 - closed below
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, cluster.url],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None

    def step() -> dict[str, object]:
        assert child.stdout is not None
        line = child.stdout.readline()
        while line and not line.startswith('{"step"'):  # a log line (a retried start)
            line = child.stdout.readline()
        assert line, f"child ended: {(tmp_path / 'child.log').read_text()[-3000:]}"
        got: dict[str, object] = json.loads(line)
        return got

    try:
        started = step()
        assert started == {"step": "started", "status": None, "n": 100}
        cluster.kill_worker(0)
        cluster.kill_worker(1)
        child.stdin.write("\n")
        child.stdin.flush()
        missing = step()
        assert missing["step"] == "no workers"
        assert missing["status"] == f"no Spark executor registered (master {cluster.url})"
        cluster.ensure_healthy()
        child.stdin.write("\n")
        child.stdin.flush()
        assert step() == {"step": "stopped", "status": "the SparkContext is stopped"}
        recreated = step()
        assert recreated == {
            "step": "recreated",
            "same": False,
            "status": None,
            "n": 100,
            "kept": True,
        }
        wait_until(lambda: child.poll() is not None, 60, "the child to exit")
        assert child.returncode == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        log.close()
