"""When the subscriber's Spark JVM starts (``[spark] start``, subscriber/apply/lazy.py).

``on_demand`` (the default): a subscriber that stays in sync never starts a JVM (some
400 MB and 8 s of CPU saved); batches of ``spark_min_rows`` row changes begin the start
once they have kept coming for ``start_after_s`` (a single big batch does not; with
``start_after_s = 0`` the first one does), and are applied in the driver meanwhile, so
nothing waits for it.
``at_start``: the JVM starts with the daemon.  Real daemons; the JVM is looked for
among the subscriber process's descendants.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.support.harness import Pair, wait_until

pytestmark = pytest.mark.spark

DDL = "CREATE TABLE items (id INTEGER PRIMARY KEY, v TEXT, n INTEGER)"


def _java_below(pid: int) -> bool:
    """Whether a ``java`` process descends from ``pid``."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        child = int(stat.parent.name)
        parents[child], names[child] = int(fields[1]), name
    for child, name in names.items():
        up = child
        while up in parents and up > 1:
            up = parents[up]
            if up == pid:
                if name == "java":
                    return True
                break
    return False


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT * FROM items ORDER BY id").fetchall()


def _equal(pair: Pair, src: sqlite3.Connection) -> None:
    want = src.execute("SELECT * FROM items ORDER BY id").fetchall()

    def done() -> bool:
        try:
            return pair.status().state == "in_sync" and _rows(pair.target_path) == want
        except sqlite3.Error:
            return False

    wait_until(done, 120, "the target to equal the source", interval=0.2)


def _pair(
    tmp_path: Path, start: str | None, after_s: float | None = None
) -> tuple[Pair, sqlite3.Connection]:
    spark: dict[str, object] = {"start": start} if start else {}
    if after_s is not None:
        spark["start_after_s"] = after_s
    extra = {"spark": spark} if spark else {}
    pair = Pair(tmp_path, tables=["items"], subscriber_extra=extra)
    src = sqlite3.connect(pair.source_path, isolation_level=None)
    src.execute(DDL)
    return pair, src


def _big(src: sqlite3.Connection) -> None:
    """One transaction of 15,000 row changes: over spark_min_rows (10,000)."""
    with src:
        src.execute("BEGIN")
        src.executemany(
            "INSERT INTO items VALUES (?, ?, ?)",
            ((i, f"big {i}", i % 97) for i in range(1000, 16_000)),
        )


def test_one_big_batch_is_applied_without_starting_a_jvm(tmp_path: Path) -> None:
    pair, src = _pair(tmp_path, None)  # start_after_s: the default
    try:
        pair.start_publisher()
        pair.start_subscriber()
        assert pair.sub is not None
        assert pair.sub.proc is not None
        src.execute("INSERT INTO items VALUES (1, 'a', 1)")
        _equal(pair, src)
        _big(src)
        _equal(pair, src)  # planned in the driver
        # The start is begun (or not) while the batch is planned, before it is applied.
        assert "spark session starting" not in pair.sub.log_path.read_text()
        assert not _java_below(pair.sub.proc.pid), "one big batch started a JVM"
    finally:
        pair.stop()
        src.close()


def test_in_sync_without_a_jvm_until_a_big_batch_needs_one(tmp_path: Path) -> None:
    pair, src = _pair(tmp_path, None, after_s=0.0)
    try:
        pair.start_publisher()
        pair.start_subscriber()
        assert pair.sub is not None
        assert pair.sub.proc is not None
        for i in range(40):  # live, one row change each
            src.execute("INSERT INTO items VALUES (?, ?, ?)", (i, f"v{i}", i))
        _equal(pair, src)
        assert not _java_below(pair.sub.proc.pid), "an in-sync subscriber started a JVM"

        _big(src)
        _equal(pair, src)  # applied in the driver while the JVM starts, or in Spark
        wait_until(lambda: _java_below(pair.sub.proc.pid), 60, "the JVM to start")  # type: ignore[union-attr]
        wait_until(
            lambda: "spark warmed up" in pair.sub.log_path.read_text(),  # type: ignore[union-attr]
            120,
            "the session to start and warm up",
        )
        with src:  # the next big batch goes through Spark's net effect
            src.execute("BEGIN")
            src.execute("UPDATE items SET n = n + 1, v = v || '!' WHERE id >= 1000")
            src.execute("DELETE FROM items WHERE id % 10 = 3")
        _equal(pair, src)
        assert pair.sub.stop() == 0, pair.sub.tail()
    finally:
        pair.stop()
        src.close()


def test_at_start_starts_the_jvm_with_the_daemon(tmp_path: Path) -> None:
    pair, src = _pair(tmp_path, "at_start")
    try:
        pair.start_publisher()
        pair.start_subscriber()
        assert pair.sub is not None
        assert pair.sub.proc is not None
        pid = pair.sub.proc.pid
        wait_until(lambda: _java_below(pid), 60, "the JVM to start with the daemon")
        src.execute("INSERT INTO items VALUES (1, 'a', 1)")
        _equal(pair, src)
    finally:
        pair.stop()
        src.close()


def test_an_unknown_start_mode_is_refused_at_load(tmp_path: Path) -> None:
    from subscriber.config import SparkConfig

    with pytest.raises(ValueError, match=r"spark\.start 'later'.*on_demand.*at_start"):
        SparkConfig(start="later")
