"""A catch-up batch of the default limits runs no Spark job, and ends as Spark's does.

Issue 23: a Spark job costs a fixed 0.4 s and ~2.6 us per row change on the
reference machine, which bounded the catch-up below the goal; the default
``[apply] spark_min_rows`` now keeps catch-up batches of plain tables in the
driver (docs/apply.md).  A W1 stream of 8,001 transactions (18,895 row
changes, over the old threshold of 10,000) is applied in one batch with the
default options and, beside it, with ``spark_min_rows = 0`` (every batch
through Spark): the targets must hold the same rows, and the default must not
have started a Spark job.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier
from subscriber.apply.options import ApplyOptions
from subscriber.targets.sqlite import SqliteWriter
from tests.support.w1_entries import W1_SCHEMAS, w1_entries

pytestmark = pytest.mark.spark


def _jobs(spark: Any) -> int:
    """Spark jobs the session has run so far (its status tracker, no job group)."""
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


def _apply(spark: Any, path: Path, options: ApplyOptions, stream: list[pb.Entry]) -> int:
    writer = SqliteWriter(path)
    try:
        applier = Applier(spark, writer, "catchup", options=options)
        schemas = pb.Entry(ops=[pb.Op(schema=s) for s in W1_SCHEMAS])
        level = applier.apply(1, [schemas], incarnation="i").level
        res = applier.apply(level + 1, stream, incarnation="i")
        assert res.level == 1 + len(stream)
        return res.rows
    finally:
        writer.close()


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as conn:
        return {
            t: conn.execute(f'SELECT * FROM "{t}" ORDER BY id').fetchall()
            for t in ("accounts", "orders")
        }


def test_a_catch_up_batch_has_its_net_effect_in_the_driver(spark: Any, tmp_path: Path) -> None:
    stream = w1_entries(8_001)
    in_spark = tmp_path / "spark.db"
    rows = _apply(spark, in_spark, ApplyOptions(spark_min_rows=0), stream)
    assert rows > 10_000  # the old default sent this batch to Spark
    before = _jobs(spark)
    assert before > 0  # the tracker sees the jobs of the reference apply

    in_driver = tmp_path / "driver.db"
    assert _apply(spark, in_driver, ApplyOptions(), stream) == rows
    assert _jobs(spark) == before, "a catch-up batch of the default limits ran a Spark job"

    got, want = _rows(in_driver), _rows(in_spark)
    assert len(want["accounts"]) == 10_000
    assert len(want["orders"]) > 7_000
    assert got == want
