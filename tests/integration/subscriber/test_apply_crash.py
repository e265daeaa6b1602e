"""Crash safety: a child process applying batches is SIGKILLed mid-apply, repeatedly.

Every entry ``s`` sets a counter row to ``s`` and inserts a log row keyed by ``s``,
so after any crash the target must hold exactly: counter == level and log rows
1..level — nothing lost, nothing half-applied, nothing beyond the level.

Run as a script, this file is the child: it applies random-sized batches until
the level reaches the total, printing ``applied <level>`` after each commit.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import values
from common.rpc import txrepl_pb2 as pb

T = pb.ColumnType
ROOT = Path(__file__).resolve().parents[3]
INC = "crash-incarnation"

COUNTER = pb.TableSchema(
    table="counter",
    columns=[
        pb.Column(name="id", type=T.COLUMN_TYPE_INTEGER),
        pb.Column(name="n", type=T.COLUMN_TYPE_INTEGER),
    ],
    primary_key=["id"],
)
LOG = pb.TableSchema(
    table="log",
    columns=[
        pb.Column(name="seq", type=T.COLUMN_TYPE_INTEGER),
        pb.Column(name="payload", type=T.COLUMN_TYPE_TEXT, nullable=True),
    ],
    primary_key=["seq"],
)


def make_entry(seq: int) -> pb.Entry:
    """Entry ``seq``: counter := seq, log row seq (entry 1 also creates both tables)."""
    ops: list[pb.Op] = []
    if seq == 1:
        ops += [pb.Op(schema=COUNTER), pb.Op(schema=LOG)]
    counter = [values.encode(0), values.encode(seq)]
    if seq == 1:
        ops.append(pb.Op(row=pb.RowChange(table="counter", op=pb.ROW_OP_INSERT, row=counter)))
    else:
        ops.append(
            pb.Op(
                row=pb.RowChange(
                    table="counter", op=pb.ROW_OP_UPDATE, key=[values.encode(0)], row=counter
                )
            )
        )
    log = [values.encode(seq), values.encode(f"entry {seq} " + "x" * 40)]
    ops.append(pb.Op(row=pb.RowChange(table="log", op=pb.ROW_OP_INSERT, row=log)))
    return pb.Entry(commit_time_us=seq, source_position=str(seq), ops=ops)


def child(target: str, total: int) -> None:
    from subscriber.apply import Applier, ApplyOptions, SparkSettings, create_spark_session
    from subscriber.targets.sqlite import SqliteWriter

    spark = create_spark_session(SparkSettings(master="local[2]", app_name="txrepl-crash"))
    # Every batch through Spark, however small: this is the Spark apply under kills.
    applier = Applier(
        spark, SqliteWriter(target), subscription="crash", options=ApplyOptions(spark_min_rows=0)
    )
    rng = random.Random()
    level = applier.load_state().level
    while level < total:
        n = min(total - level, rng.randint(200, 3000))
        res = applier.apply(
            level + 1, [make_entry(s) for s in range(level + 1, level + 1 + n)], incarnation=INC
        )
        level = res.level
        print(f"applied {level}", flush=True)


def check(target: Path) -> int:
    """Assert the invariant; return the level."""
    with sqlite3.connect(target) as conn:
        row = conn.execute(
            "SELECT level FROM txrepl_subscriptions WHERE subscription = 'crash'"
        ).fetchone()
        level = 0 if row is None else int(row[0])
        if level == 0:
            return 0
        counter = conn.execute("SELECT n FROM counter WHERE id = 0").fetchone()[0]
        count, lo, hi = conn.execute("SELECT count(*), min(seq), max(seq) FROM log").fetchone()
    assert counter == level
    assert (count, lo, hi) == (level, 1, level)
    return level


def spawn(target: Path, total: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, __file__, str(target), str(total)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: the kill takes Spark's JVM too
    )


def crash_and_recover(target: Path, kills: int, total: int) -> None:
    rng = random.Random(1234)
    levels: list[int] = []
    for _ in range(kills):
        proc = spawn(target, total)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # the first commit: Spark is warm now
            while line and not line.startswith("applied"):  # the engine's log lines
                line = proc.stdout.readline()
            assert line.startswith("applied"), f"child failed before applying: {line!r}"
            time.sleep(rng.uniform(0.0, 1.5))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        levels.append(check(target))
    # Finally let a child run to the end.
    proc = spawn(target, total)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert check(target) == total
    # Every kill landed before the end, and no level ever went backwards.
    assert levels == sorted(levels), levels
    assert levels[-1] < total, levels


@pytest.mark.short_of("test_sigkill_many_times")
@pytest.mark.spark
def test_sigkill_mid_apply_keeps_level_and_rows_in_step(tmp_path: Path) -> None:
    """Three SIGKILLs at random moments of applying leave exactly the state of the level."""
    crash_and_recover(tmp_path / "target.db", kills=3, total=12_000)


@pytest.mark.spark
@pytest.mark.slow
def test_sigkill_many_times(tmp_path: Path) -> None:
    """Five SIGKILLs into larger batches: the same invariant, more often.

    Each child applies at most ~15k entries before its kill (Spark start-up, its
    first commit, at most 1.5 s more), so 100k entries outlast the kills."""
    crash_and_recover(tmp_path / "target.db", kills=5, total=100_000)


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]))
