"""Small batches into PostgreSQL with their statements queued and sent at once
(subscriber/targets/postgres/_queued.py): the same rows, levels and refusals as the
staging path and psycopg's pipeline."""

from __future__ import annotations

import datetime as dt
import decimal
import random
from typing import Any

import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, ApplyError, GapError
from subscriber.targets.postgres import PostgresWriter
from tests.support.entries import INC, ITEMS, dele, entry, ins, schema_op, typed_schema, upd

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

TYPED = typed_schema("typed")


def fetch(dsn: str, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(text.encode()).fetchall()


def queued_names(writer: PostgresWriter) -> list[str]:
    """The statements the queued path prepared on the writer's connection."""
    assert writer._conn is not None
    rows = writer._conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE '\\_txrepl\\_%'"
    ).fetchall()
    return [r[0] for r in rows]


def _typed_row(rng: random.Random, key: str) -> list[Any]:
    """A row of every type, each cell NULL one time in five (the key never)."""

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.2 else value

    return [
        key,
        maybe(rng.randint(-(2**63), 2**63 - 1)),
        maybe(decimal.Decimal(rng.randint(-(10**12), 10**12)) / 1000),
        maybe(rng.choice([0.1, -0.0, 1e300, 2.5e-308, float("inf"), rng.random()])),
        maybe(bytes(rng.randrange(256) for _ in range(rng.randint(0, 5)))),
        maybe(rng.random() < 0.5),
        maybe(dt.date(1, 1, 1) + dt.timedelta(days=rng.randint(0, 3_000_000))),
        maybe(dt.time(rng.randint(0, 23), rng.randint(0, 59), 1, rng.randint(0, 999_999))),
        maybe(dt.datetime(2026, 11, 25, 12, 0) + dt.timedelta(microseconds=rng.randint(0, 10**12))),
        maybe(
            dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=rng.randint(-12, 12))))
            + dt.timedelta(seconds=rng.randint(0, 10**7))
        ),
        maybe(rng.choice(["{}", '{"a": [1, "x\'y"]}', "null", '"\\\\ %s $1"'])),
    ]


def _batches(seed: int, count: int) -> list[list[pb.Entry]]:
    """Seeded batches of 1-3 entries: inserts, updates, same-key chains, deletes and
    re-inserts of a few keys (text with quotes, percent signs and backslashes)."""
    rng = random.Random(seed)
    keys = ["a", "b'c", "d%s", "e\\f", "g;h", "é"]
    present: set[str] = set()
    out = []
    for _ in range(count):
        entries = []
        for _ in range(rng.randint(1, 3)):
            ops = []
            for _ in range(rng.randint(1, 3)):
                key = rng.choice(keys)
                if key in present and rng.random() < 0.3:
                    ops.append(dele("typed", key))
                    present.discard(key)
                elif key in present:
                    ops.append(upd("typed", (key,), *_typed_row(rng, key)))
                else:
                    ops.append(ins("typed", *_typed_row(rng, key)))
                    present.add(key)
            entries.append(entry(*ops))
        out.append(entries)
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_queued_batches_leave_the_rows_the_staging_path_leaves(
    spark: Any, pg_db: str, seed: int
) -> None:
    """Seeded batches of every type, NULLs, same-key chains, deletes and re-inserts
    end in the same rows and level whether their statements are queued or staged."""
    got = []
    for small_values in (0, 4000):  # 0: every rows step staged (COPY)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS typed")
            conn.execute("DROP TABLE IF EXISTS txrepl_subscriptions")
        writer = PostgresWriter(pg_db)
        writer.small_values = small_values
        applier = Applier(spark, writer, subscription="s")
        level = applier.apply(1, [entry(schema_op(TYPED))], incarnation=INC).level
        for batch in _batches(seed, 40):
            level = applier.apply(level + 1, batch, incarnation=INC).level
        if small_values:
            assert queued_names(writer), "the batches were not queued"
        got.append(
            (
                level,
                fetch(pg_db, "SELECT level FROM txrepl_subscriptions"),
                fetch(pg_db, "SELECT * FROM typed ORDER BY k"),
            )
        )
        writer.close()
    assert got[0] == got[1]
    assert got[0][2], "no rows left to compare"


def test_a_queued_batch_refused_on_a_row_commits_nothing_and_the_next_applies(
    spark: Any, pg_db: str
) -> None:
    """A queued batch that fails on a row (a CHECK) raises the server's error, commits
    none of its rows nor its level; once the constraint is gone the batch applies."""
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    for seq in (2, 3, 4):  # the statements seen, then prepared
        applier.apply(seq, [entry(ins("items", seq, f"n{seq}", None))], incarnation=INC)
    assert queued_names(writer)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE items ADD CONSTRAINT small CHECK (id < 100)")
    # One entry (a source transaction is never split): its good rows go with the bad.
    bad = [entry(ins("items", 5, "ok", None), upd("items", (2,), 2, "two", None),
                 ins("items", 500, "too big", None))]  # fmt: skip
    with pytest.raises(ApplyError, match="small"):
        applier.apply(5, bad, incarnation=INC)
    assert fetch(pg_db, "SELECT id, name FROM items ORDER BY id") == [
        (2, "n2"),
        (3, "n3"),
        (4, "n4"),
    ]
    assert fetch(pg_db, "SELECT level FROM txrepl_subscriptions") == [(4,)]
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE items DROP CONSTRAINT small")
    assert applier.apply(5, bad, incarnation=INC).level == 5
    assert fetch(pg_db, "SELECT id, name FROM items ORDER BY id") == [
        (2, "two"),
        (3, "n3"),
        (4, "n4"),
        (5, "ok"),
        (500, "too big"),
    ]
    writer.close()


def test_a_queued_batch_that_does_not_follow_the_level_is_a_gap(spark: Any, pg_db: str) -> None:
    """The level moved under a queued batch: a gap (not a row error for the error
    queue), nothing committed; the writer goes on from the moved level."""
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    for seq in (2, 3, 4):
        applier.apply(seq, [entry(ins("items", seq, f"n{seq}", None))], incarnation=INC)
    assert queued_names(writer)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE items ADD CHECK (id < 100)")
        conn.execute("UPDATE txrepl_subscriptions SET level = 7")
    with pytest.raises(GapError, match="level is 7"):
        applier.apply(5, [entry(ins("items", 500, "too big", None))], incarnation=INC)
    assert fetch(pg_db, "SELECT count(*) FROM items") == [(3,)]
    assert fetch(pg_db, "SELECT level FROM txrepl_subscriptions") == [(7,)]
    assert fetch(pg_db, "SELECT count(*) FROM txrepl_errors") == [(0,)]  # not stored
    assert applier.apply(8, [entry(dele("items", 3))], incarnation=INC).level == 8
    assert fetch(pg_db, "SELECT id FROM items ORDER BY id") == [(2,), (4,)]
    writer.close()
