"""PostgreSQL-specific apply behaviour: types, replication role, replay role, the level lock."""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import time
from typing import Any

import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import (
    Applier,
    GapError,
    PoisonEntryError,
    PostgresWriter,
    TransientError,
    WriterError,
)
from tests.unit.test_apply_sqlite import INC, ITEMS, T, col, dele, entry, ins, schema_op

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def fetch(dsn: str, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(text.encode()).fetchall()


def run(dsn: str, text: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text.encode())


def test_typed_values_and_ddl(spark: Any, pg_db: str) -> None:
    """Every logical type gets its PostgreSQL type and its value back exactly."""
    schema = pb.TableSchema(
        table="Typed",
        columns=[
            col("k", T.COLUMN_TYPE_TEXT, nullable=False),
            col("i", T.COLUMN_TYPE_INTEGER, nullable=False),
            pb.Column(name="d", type=T.COLUMN_TYPE_DECIMAL, precision=12, scale=2, nullable=True),
            col("f", T.COLUMN_TYPE_FLOAT),
            col("b", T.COLUMN_TYPE_BYTES),
            col("bo", T.COLUMN_TYPE_BOOLEAN),
            col("da", T.COLUMN_TYPE_DATE),
            col("ti", T.COLUMN_TYPE_TIME),
            col("ts", T.COLUMN_TYPE_TIMESTAMP),
            col("tz", T.COLUMN_TYPE_TIMESTAMPTZ),
            col("j", T.COLUMN_TYPE_JSON),
            col("Mixed Case", T.COLUMN_TYPE_TEXT),
        ],
        primary_key=["k"],
    )
    tz = dt.timezone(dt.timedelta(hours=-5, minutes=-30))
    row = (
        "x",
        2**62,
        decimal.Decimal("1234567890.12"),
        0.1,
        b"\x00\xff",
        True,
        dt.date(1969, 12, 31),
        dt.time(23, 59, 59, 1),
        dt.datetime(2024, 2, 29, 12, 0, 0, 5),
        dt.datetime(2024, 1, 1, 8, 0, tzinfo=tz),
        '{"a": [1, 2]}',
        "q",
    )
    op = ins("Typed", *row)
    op.row.row[10].CopyFrom(pb.Value(json=row[10]))
    # A text in an INTEGER column cannot be stored by PostgreSQL: the batch is refused.
    odd = ins("Typed", "y", "not a number", *([None] * 10))
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(schema), op)], incarnation=INC)
    types = fetch(
        pg_db,
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
        " WHERE attrelid = '\"Typed\"'::regclass AND attnum > 0 ORDER BY attnum",
    )
    assert [t[1] for t in types] == [
        "text", "bigint", "numeric(12,2)", "double precision", "bytea", "boolean", "date",
        "time without time zone", "timestamp without time zone", "timestamp with time zone",
        "jsonb", "text",
    ]  # fmt: skip
    assert [t[2] for t in types][:3] == [True, True, False]
    [got] = fetch(pg_db, 'SELECT * FROM "Typed"')
    assert got[:9] == row[:9]
    assert got[9] == row[9]  # the same instant (PostgreSQL keeps no offset)
    assert got[10] == {"a": [1, 2]}
    assert got[11] == "q"
    with pytest.raises(PoisonEntryError, match="invalid input syntax") as info:
        applier.apply(2, [entry(odd)], incarnation=INC)
    assert isinstance(info.value.cause, WriterError)
    writer.close()


def test_target_triggers_do_not_fire_as_replica(spark: Any, pg_db: str) -> None:
    """With session_replication_role = replica ordinary triggers stay quiet; 'origin' fires them."""
    writer = PostgresWriter(pg_db)
    Applier(spark, writer, subscription="s").apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    run(
        pg_db,
        "CREATE TABLE audit (n int);"
        "CREATE FUNCTION audit_fn() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN INSERT INTO audit VALUES (1); RETURN NEW; END$$;"
        "CREATE TRIGGER t AFTER INSERT ON items FOR EACH ROW EXECUTE FUNCTION audit_fn()",
    )
    Applier(spark, writer, subscription="s").apply(
        2, [entry(ins("items", 1, "a", None))], incarnation=INC
    )
    assert fetch(pg_db, "SELECT count(*) FROM audit") == [(0,)]
    origin = PostgresWriter(pg_db, replication_role="origin")
    Applier(spark, origin, subscription="s").apply(
        3, [entry(ins("items", 2, "b", None))], incarnation=INC
    )
    assert fetch(pg_db, "SELECT count(*) FROM audit") == [(1,)]
    writer.close()
    origin.close()


def test_replay_role_owns_what_it_creates(spark: Any, pg_db: str) -> None:
    """With role=..., tables are created and rows written as that role."""
    run(pg_db, "CREATE ROLE replay NOLOGIN; GRANT CREATE ON SCHEMA public TO replay")
    writer = PostgresWriter(pg_db, role="replay")
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS), ins("items", 1, "a", None))], incarnation=INC)
    assert fetch(pg_db, "SELECT tableowner FROM pg_tables WHERE tablename = 'items'") == [
        ("replay",)
    ]
    writer.close()


def test_level_lock_makes_a_concurrent_writer_wait_then_fail(spark: Any, pg_db: str) -> None:
    """A writer blocked on the level row lock sees the moved level afterwards and refuses."""
    writer = PostgresWriter(pg_db)
    Applier(spark, writer, subscription="s").apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    holder = psycopg.connect(pg_db)
    holder.execute("SELECT level FROM txrepl_subscriptions WHERE subscription = 's' FOR UPDATE")
    outcome: list[BaseException | int] = []

    def second() -> None:
        try:
            outcome.append(PostgresWriter(pg_db).write("s", INC, 2, 2, []))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.5)
    assert not outcome  # waiting on the lock
    holder.execute("UPDATE txrepl_subscriptions SET level = 2 WHERE subscription = 's'")
    holder.commit()
    t.join(10)
    holder.close()
    assert len(outcome) == 1
    assert isinstance(outcome[0], GapError)


def test_lock_timeout_is_transient(spark: Any, pg_db: str) -> None:
    """A lock timeout is translated into TransientError (the applier retries those)."""
    writer = PostgresWriter(pg_db, lock_timeout_s=0.2)
    Applier(spark, writer, subscription="s").apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    with psycopg.connect(pg_db) as holder:
        holder.execute("SELECT 1 FROM txrepl_subscriptions FOR UPDATE")
        with pytest.raises(TransientError, match="LockNotAvailable"):
            writer.write("s", INC, 2, 2, [])
    writer.write("s", INC, 2, 2, [])  # and afterwards it works
    writer.close()


def test_staging_tables_are_kept_per_shape_and_a_rollback_takes_them_away(
    spark: Any, pg_db: str
) -> None:
    """A failed batch rolls back the staging tables it created; the next batch makes
    them again, and from then on every batch reuses them."""
    run(
        pg_db,
        "CREATE TABLE items(id bigint PRIMARY KEY, name text, price numeric CHECK (id < 100))",
    )
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    bad = entry(ins("items", 500, "too big", decimal.Decimal("1.00")))
    with pytest.raises(PoisonEntryError):
        applier.apply(2, [bad], incarnation=INC)
    run(pg_db, "ALTER TABLE items DROP CONSTRAINT items_id_check")
    applier.apply(2, [bad], incarnation=INC)  # the operator fixed the target: it applies
    level = 2
    for i in range(10):
        ops = [ins("items", i, f"n{i}", decimal.Decimal(i)), dele("items", 500 - i)]
        level = applier.apply(level + 1, [entry(*ops)], incarnation=INC).level
    assert fetch(pg_db, "SELECT count(*) FROM items") == [(10,)]
    stages = fetch(
        pg_db,
        "SELECT relname FROM pg_class WHERE relpersistence = 't'"
        " AND relname LIKE '\\_txrepl\\_stage%' ORDER BY relname",
    )
    assert stages == [("_txrepl_stage0",), ("_txrepl_stage1",)]  # rows, and keys to delete
    writer.close()
