"""Small batches into PostgreSQL: rows by statements, in pipeline mode, the level
checked last (subscriber/targets/postgres/_pipeline.py)."""

from __future__ import annotations

import decimal
import threading
from typing import Any

import psycopg
import pytest

from subscriber.apply import Applier, ApplyOptions, GapError, TransientError
from subscriber.targets.postgres import PostgresWriter
from tests.support.entries import INC, ITEMS, dele, entry, ins, schema_op, upd

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def fetch(dsn: str, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(text.encode()).fetchall()


STAGES = (
    "SELECT count(*) FROM pg_class WHERE relpersistence = 't' AND relname LIKE '\\_txrepl\\_stage%'"
)


def _batches() -> list[list[Any]]:
    """Inserts, then updates and deletes of the same keys, a NULL and an empty text."""
    first = [entry(ins("items", i, f"n{i}", decimal.Decimal(f"{i}.50"))) for i in range(1, 7)]
    first.append(entry(ins("items", 7, "", None)))
    second = [
        entry(upd("items", (2,), 2, "two", None), dele("items", 3)),
        entry(dele("items", 4), ins("items", 8, None, decimal.Decimal("0.01"))),
        entry(upd("items", (7,), 7, "", decimal.Decimal("7.77"))),
    ]
    return [first, second]


def test_small_batches_skip_staging_with_the_same_result(spark: Any, pg_db: str) -> None:
    """Small batches are written without a staging table, and leave the rows the
    staging path leaves (NULL and '' kept apart)."""
    got = []
    for small_values in (0, 4000):  # 0: every rows step staged, as before
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS items")
        writer = PostgresWriter(pg_db)
        writer.small_values = small_values
        applier = Applier(spark, writer, subscription=f"s{small_values}")
        level = applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC).level
        for batch in _batches():
            level = applier.apply(level + 1, batch, incarnation=INC).level
        got.append(fetch(pg_db, "SELECT id, name, price FROM items ORDER BY id"))
        assert writer._conn is not None
        stages = writer._conn.execute(STAGES.encode()).fetchone()
        writer._conn.rollback()
        assert stages == ((2,) if small_values == 0 else (0,))
        writer.close()
    staged, small = got
    assert small == staged
    assert (7, "", decimal.Decimal("7.77")) in small
    assert (2, "two", None) in small
    assert (8, None, decimal.Decimal("0.01")) in small
    assert [r[0] for r in small] == [1, 2, 5, 6, 7, 8]


def _lock_waiters(dsn: str, count: int, done: list[Any]) -> None:
    """Until ``count`` subscriber sessions wait on a lock (or one gave up: ``done``)."""
    with psycopg.connect(dsn, autocommit=True) as watcher:
        for _ in range(600):
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND application_name = 'txrepl-subscriber'"
            ).fetchone()
            if waiting == (count,) or done:
                return
            threading.Event().wait(0.05)


def _started(applier: Applier, seq: int, batch: list[Any], outcome: list[Any]) -> threading.Thread:
    """A thread applying ``batch`` at ``seq``; its level or its error lands in ``outcome``."""

    def apply() -> None:
        try:
            outcome.append(applier.apply(seq, batch, incarnation=INC).level)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    t = threading.Thread(target=apply)
    t.start()
    return t


def test_a_batch_whose_level_moved_while_it_waited_commits_nothing(spark: Any, pg_db: str) -> None:
    """A pipelined batch waits at the level row's lock; the level moved meanwhile, so
    the check read at the end refuses it and none of its rows is committed."""
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    holder = psycopg.connect(pg_db)
    holder.execute("SELECT level FROM txrepl_subscriptions WHERE subscription = 's' FOR UPDATE")
    outcome: list[BaseException | int] = []
    t = _started(applier, 2, [entry(ins("items", 42, "late", None))], outcome)
    _lock_waiters(pg_db, 1, outcome)  # the writer waits on the lock
    assert not outcome
    holder.execute("UPDATE txrepl_subscriptions SET level = 2 WHERE subscription = 's'")
    holder.commit()
    t.join(30)
    holder.close()
    assert len(outcome) == 1
    assert isinstance(outcome[0], GapError), outcome
    assert fetch(pg_db, "SELECT count(*) FROM items") == [(0,)]
    assert fetch(pg_db, "SELECT level FROM txrepl_subscriptions") == [(2,)]
    batch = [entry(ins("items", 42, "later", None))]
    assert applier.apply(3, batch, incarnation=INC).level == 3  # the writer goes on
    assert fetch(pg_db, "SELECT id, name FROM items") == [(42, "later")]
    writer.close()


def test_a_failing_row_of_a_batch_that_does_not_follow_the_level_is_a_gap(
    spark: Any, pg_db: str
) -> None:
    """A batch that both does not follow the level and fails on a row reports the gap
    (as when the level was checked first), not a row error for the error queue."""
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE items ADD CHECK (id < 100)")
        conn.execute("UPDATE txrepl_subscriptions SET level = 5")
    with pytest.raises(GapError, match="level is 5"):
        applier.apply(2, [entry(ins("items", 500, "too big", None))], incarnation=INC)
    assert fetch(pg_db, "SELECT count(*) FROM items") == [(0,)]
    assert fetch(pg_db, "SELECT level FROM txrepl_subscriptions") == [(5,)]
    assert fetch(pg_db, "SELECT count(*) FROM txrepl_errors") == [(0,)]  # not stored
    writer.close()


def test_two_appliers_of_one_batch_commit_it_once(spark: Any, pg_db: str) -> None:
    """Two writers apply the same batch of one subscription at once: one commits it,
    the other waits at the level row, then is refused as a gap; the row is there once."""
    writers = [PostgresWriter(pg_db) for _ in range(2)]
    appliers = [Applier(spark, w, subscription="s") for w in writers]
    appliers[0].apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    appliers[1].apply(2, [entry(ins("items", 1, "warm", None))], incarnation=INC)
    holder = psycopg.connect(pg_db)  # both writers queue behind it
    holder.execute("SELECT level FROM txrepl_subscriptions WHERE subscription = 's' FOR UPDATE")
    outcome: list[BaseException | int] = []
    batch = [entry(ins("items", 42, "once", None), upd("items", (1,), 1, "moved", None))]
    threads = [_started(a, 3, batch, outcome) for a in appliers]
    _lock_waiters(pg_db, 2, outcome)
    assert not outcome
    holder.rollback()  # the level row unchanged: whoever locks it first applies
    for t in threads:
        t.join(30)
    holder.close()
    assert sorted(map(type, outcome), key=str) == sorted([int, GapError], key=str), outcome
    assert 3 in outcome
    assert fetch(pg_db, "SELECT id, name FROM items ORDER BY id") == [(1, "moved"), (42, "once")]
    assert fetch(pg_db, "SELECT level FROM txrepl_subscriptions") == [(3,)]
    for w in writers:
        w.close()


@pytest.mark.parametrize("while_waiting", [True, False])
def test_a_deleted_level_row_refuses_a_batch_after_seq_1(
    spark: Any, pg_db: str, while_waiting: bool
) -> None:
    """An operator deletes the level row (before a batch, or while it waits for the
    row): the batch, which does not start at seq 1, is refused as a gap at level 0
    and writes nothing."""
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    applier.apply(2, [entry(ins("items", 1, "warm", None))], incarnation=INC)
    holder = psycopg.connect(pg_db)
    holder.execute("DELETE FROM txrepl_subscriptions WHERE subscription = 's'")
    if not while_waiting:
        holder.commit()
    outcome: list[BaseException | int] = []
    t = _started(applier, 3, [entry(ins("items", 42, "late", None))], outcome)
    if while_waiting:
        _lock_waiters(pg_db, 1, outcome)
        assert not outcome
        holder.commit()
    t.join(30)
    holder.close()
    assert len(outcome) == 1
    assert isinstance(outcome[0], GapError), outcome
    assert "level is 0" in str(outcome[0])
    assert fetch(pg_db, "SELECT id FROM items") == [(1,)]
    assert fetch(pg_db, "SELECT count(*) FROM txrepl_subscriptions") == [(0,)]
    writer.close()


def test_a_small_batch_waits_for_the_level_row_no_longer_than_the_lock_timeout(
    spark: Any, pg_db: str
) -> None:
    """With a lock_timeout, a small (pipelined) batch blocked at the level row fails as
    transient (its settings are in effect before the lock), and applies once free."""
    writer = PostgresWriter(pg_db, lock_timeout_s=0.2)
    applier = Applier(spark, writer, subscription="s", options=ApplyOptions(retries=1))
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    applier.apply(2, [entry(ins("items", 1, "warm", None))], incarnation=INC)
    batch = [entry(ins("items", 2, "later", None))]
    with psycopg.connect(pg_db) as holder:
        holder.execute("SELECT 1 FROM txrepl_subscriptions FOR UPDATE")
        with pytest.raises(TransientError, match="LockNotAvailable"):
            applier.apply(3, batch, incarnation=INC)
    assert applier.apply(3, batch, incarnation=INC).level == 3
    assert fetch(pg_db, "SELECT id, name FROM items ORDER BY id") == [(1, "warm"), (2, "later")]
    writer.close()
