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
from subscriber.apply import Applier, GapError, PoisonEntryError, TransientError, WriterError
from subscriber.targets.postgres import PostgresWriter
from tests.support.entries import (
    INC,
    ITEMS,
    T,
    col,
    dele,
    entry,
    ins,
    schema_op,
    typed_schema,
    upd,
)

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def fetch(dsn: str, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(text.encode()).fetchall()


def run(dsn: str, text: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text.encode())


def test_typed_values_and_ddl(spark: Any, pg_db: str) -> None:
    """Every logical type gets its PostgreSQL type and its value back exactly."""
    schema = _typed("Typed")
    schema.columns[1].nullable = False
    schema.columns.append(col("Mixed Case", T.COLUMN_TYPE_TEXT))
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
    writer.small_values = 0  # small steps are written without stages (_pipeline.py)
    applier = Applier(spark, writer, subscription="s")
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    bad = entry(ins("items", 500, "too big", decimal.Decimal("1.00")))
    with pytest.raises(PoisonEntryError):
        applier.apply(2, [bad], incarnation=INC)
    run(pg_db, "ALTER TABLE items DROP CONSTRAINT items_id_check")
    applier.apply(2, [bad], incarnation=INC)  # the operator fixed the target: it applies
    level = 2
    for i in range(10):
        # updates: upserted through a stage (fresh inserts would be COPYed directly)
        ops = [upd("items", (i,), i, f"n{i}", decimal.Decimal(i)), dele("items", 500 - i)]
        level = applier.apply(level + 1, [entry(*ops)], incarnation=INC).level
    assert fetch(pg_db, "SELECT count(*) FROM items") == [(10,)]
    stages = fetch(
        pg_db,
        "SELECT relname FROM pg_class WHERE relpersistence = 't'"
        " AND relname LIKE '\\_txrepl\\_stage%' ORDER BY relname",
    )
    assert stages == [("_txrepl_stage0",), ("_txrepl_stage1",)]  # rows, and keys to delete
    writer.close()


def _typed(table: str) -> pb.TableSchema:
    schema = typed_schema(table)
    schema.columns[2].precision, schema.columns[2].scale = 12, 2  # numeric(12,2)
    return schema


def _typed_batches(table: str) -> list[list[pb.Entry]]:
    """Two batches: 120 inserts of every type (NULLs too), then 40 deletes and 80 updates."""
    tz = dt.timezone(dt.timedelta(hours=2))

    def row(i: int, v: int) -> list[pb.Op]:
        cells: list[object] = [
            f"k{i:03d}",
            v * 7 - 300,
            decimal.Decimal(f"{v}.{v % 100:02d}"),
            v / 3 if v % 9 else float("nan"),
            bytes([v % 256, 255 - v % 256]),
            v % 2 == 0,
            dt.date(1970, 1, 1) + dt.timedelta(days=v - 60),
            dt.time(v % 24, v % 60, v % 60, v),
            dt.datetime(2024, 1, 1) + dt.timedelta(seconds=v * 3601, microseconds=v),
            dt.datetime(2024, 6, 1, tzinfo=tz) + dt.timedelta(minutes=v),
            None,
        ]
        if v % 5 == 0:
            cells[1:10] = [None] * 9
        op = ins(table, *cells)
        op.row.row[10].CopyFrom(pb.Value(json=f'{{"n": {v}}}'))
        return [op]

    first = [entry(*row(i, i)) for i in range(120)]
    second = [entry(dele(table, f"k{i:03d}")) for i in range(0, 120, 3)]
    second += [entry(*row(i, i + 1000)) for i in range(120) if i % 3]
    return [first, second]


def test_big_batches_are_staged_through_spark_jdbc_with_the_same_result(
    spark: Any, pg_db: str
) -> None:
    """Rows steps of at least jdbc_min_rows go through Spark's JDBC writer into staging
    tables, and give exactly what COPY staging gives; the tables are emptied with each
    merge and dropped when their writer closes, or by the next writer if it died."""
    from subscriber.apply import ApplyOptions

    run(pg_db, "CREATE UNLOGGED TABLE txrepl_jdbc_0123456789ab_0_u (c0 text)")  # a dead writer's
    via_jdbc = PostgresWriter(pg_db)
    via_copy = PostgresWriter(pg_db)
    jdbc = Applier(spark, via_jdbc, "j", options=ApplyOptions(jdbc_min_rows=50))
    copy = Applier(spark, via_copy, "c")
    for applier, table in ((jdbc, "tj"), (copy, "tc")):
        level = applier.apply(1, [entry(schema_op(_typed(table)))], incarnation=INC).level
        for batch in _typed_batches(table):
            level = applier.apply(level + 1, batch, incarnation=INC).level
    got_j = fetch(pg_db, "SELECT * FROM tj ORDER BY k")
    assert len(got_j) == 80
    assert repr(got_j) == repr(fetch(pg_db, "SELECT * FROM tc ORDER BY k"))  # NaN != NaN
    stages = [
        r[0]
        for r in fetch(pg_db, "SELECT relname FROM pg_class WHERE relname LIKE 'txrepl\\_jdbc\\_%'")
    ]
    token = via_jdbc._jdbc.token  # type: ignore[union-attr]
    assert sorted(stages) == [f"txrepl_jdbc_{token}_0_d", f"txrepl_jdbc_{token}_0_u"]
    for name in stages:
        assert fetch(pg_db, f"SELECT count(*) FROM {name}") == [(0,)]
    via_jdbc.close()
    via_copy.close()
    assert fetch(pg_db, "SELECT count(*) FROM pg_class WHERE relname LIKE 'txrepl\\_jdbc\\_%'") == [
        (0,)
    ]


def test_jdbc_staging_refuses_a_unix_socket_target(spark: Any, pg_db: str) -> None:
    """The executors must reach the target over TCP: a socket directory is refused at start."""
    from subscriber.apply import ApplyOptions

    writer = PostgresWriter(pg_db)
    socket_dsn = "postgresql:///txrepl?host=/var/run/postgresql"
    writer.dsn = socket_dsn
    with pytest.raises(ValueError, match="one TCP host"):
        Applier(spark, writer, "s", options=ApplyOptions(jdbc_min_rows=10))
    writer.close()
