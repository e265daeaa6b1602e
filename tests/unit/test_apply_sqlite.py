"""The apply engine on a SQLite target: schema ops, row changes, net effect, gaps, state."""

from __future__ import annotations

import datetime as dt
import decimal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from common import values
from common.rpc import txrepl_pb2 as pb
from subscriber.apply import (
    Applier,
    ApplyError,
    GapError,
    SchemaError,
    SqliteWriter,
)

pytestmark = pytest.mark.spark

T = pb.ColumnType
INC = "incarnation-1"


def col(name: str, ctype: int, nullable: bool = True, scale: int = 0) -> pb.Column:
    return pb.Column(name=name, type=ctype, nullable=nullable, scale=scale)  # type: ignore[arg-type]


ITEMS = pb.TableSchema(
    table="items",
    columns=[
        col("id", T.COLUMN_TYPE_INTEGER, nullable=False),
        col("name", T.COLUMN_TYPE_TEXT),
        col("price", T.COLUMN_TYPE_DECIMAL, scale=2),
    ],
    primary_key=["id"],
)


def schema_op(schema: pb.TableSchema) -> pb.Op:
    return pb.Op(schema=schema)


def ins(table: str, *row: object) -> pb.Op:
    return pb.Op(
        row=pb.RowChange(table=table, op=pb.ROW_OP_INSERT, row=[values.encode(v) for v in row])
    )


def upd(table: str, key: tuple[object, ...], *row: object) -> pb.Op:
    return pb.Op(
        row=pb.RowChange(
            table=table,
            op=pb.ROW_OP_UPDATE,
            key=[values.encode(v) for v in key],
            row=[values.encode(v) for v in row],
        )
    )


def dele(table: str, *key: object) -> pb.Op:
    return pb.Op(
        row=pb.RowChange(table=table, op=pb.ROW_OP_DELETE, key=[values.encode(v) for v in key])
    )


def entry(*ops: pb.Op) -> pb.Entry:
    return pb.Entry(commit_time_us=1, source_position="p", ops=list(ops))


def rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(f'SELECT * FROM "{table}" ORDER BY 1').fetchall()


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return tmp_path / "target.db"


@pytest.fixture
def applier(spark: Any, target: Path) -> Applier:
    return Applier(spark, SqliteWriter(target), subscription="sub")


def test_schema_op_creates_table_and_records_schema(applier: Applier, target: Path) -> None:
    """A schema op creates the table with its primary key and stores the schema."""
    res = applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    assert res.level == 1
    with sqlite3.connect(target) as conn:
        info = conn.execute('PRAGMA table_info("items")').fetchall()
    assert [(r[1], r[2], r[5]) for r in info] == [
        ("id", "INTEGER", 1),
        ("name", "TEXT", 0),
        ("price", "TEXT", 0),
    ]
    assert applier.load_state().schemas["items"] == ITEMS


def test_insert_update_delete(applier: Applier, target: Path) -> None:
    """Inserts, updates and deletes over several batches leave the expected rows."""
    applier.apply(
        1,
        [
            entry(schema_op(ITEMS)),
            entry(ins("items", 1, "a", decimal.Decimal("1.10")), ins("items", 2, "b", None)),
        ],
        incarnation=INC,
    )
    assert rows(target, "items") == [(1, "a", "1.10"), (2, "b", None)]
    res = applier.apply(
        3,
        [entry(upd("items", (1,), 1, "a2", decimal.Decimal("9.99"))), entry(dele("items", 2))],
        incarnation=INC,
    )
    assert (res.level, res.rows) == (4, 2)
    assert rows(target, "items") == [(1, "a2", "9.99")]


def test_key_change_is_delete_plus_insert(applier: Applier, target: Path) -> None:
    """An update that changes the key removes the old key and writes the new one."""
    applier.apply(1, [entry(schema_op(ITEMS), ins("items", 1, "a", None))], incarnation=INC)
    applier.apply(2, [entry(upd("items", (1,), 7, "a", None))], incarnation=INC)
    assert rows(target, "items") == [(7, "a", None)]
    # Swap keys within one batch: 7 -> 8, then a new 7 appears.
    applier.apply(
        3,
        [entry(upd("items", (7,), 8, "moved", None)), entry(ins("items", 7, "new", None))],
        incarnation=INC,
    )
    assert rows(target, "items") == [(7, "new", None), (8, "moved", None)]


def test_same_key_many_times_in_one_batch(applier: Applier, target: Path) -> None:
    """The last event per key in (seq, position) order wins, even within one entry."""
    ops = [ins("items", 1, "v0", None)]
    ops += [upd("items", (1,), 1, f"v{i}", None) for i in range(1, 50)]
    ops += [dele("items", 1), ins("items", 1, "final", None), ins("items", 2, "x", None)]
    ops += [dele("items", 2)]
    res = applier.apply(
        1, [entry(schema_op(ITEMS)), entry(*ops[:20]), entry(*ops[20:])], incarnation=INC
    )
    assert res.rows == len(ops)
    assert rows(target, "items") == [(1, "final", None)]


def test_add_column_mid_stream(applier: Applier, target: Path) -> None:
    """A schema op adding a column splits the batch; rows before and after land right."""
    wider = pb.TableSchema()
    wider.CopyFrom(ITEMS)
    wider.columns.append(col("stock", T.COLUMN_TYPE_INTEGER))
    applier.apply(
        1,
        [
            entry(schema_op(ITEMS), ins("items", 1, "a", None)),
            entry(schema_op(wider), ins("items", 2, "b", None, 5)),
            entry(upd("items", (1,), 1, "a", None, 3)),
        ],
        incarnation=INC,
    )
    assert rows(target, "items") == [(1, "a", None, 3), (2, "b", None, 5)]
    assert len(applier.load_state().schemas["items"].columns) == 4


def test_gap_is_refused_and_changes_nothing(applier: Applier, target: Path) -> None:
    """A batch not starting at level + 1 raises GapError and leaves rows and level alone."""
    applier.apply(1, [entry(schema_op(ITEMS), ins("items", 1, "a", None))], incarnation=INC)
    for first in (1, 3, 100):
        with pytest.raises(GapError, match="expected seq 2"):
            applier.apply(first, [entry(ins("items", 9, "z", None))], incarnation=INC)
    with pytest.raises(GapError, match="incarnation"):
        applier.apply(2, [entry(ins("items", 9, "z", None))], incarnation="other")
    assert rows(target, "items") == [(1, "a", None)]
    assert applier.load_state().level == 1


def test_failed_batch_rolls_back_everything(applier: Applier, target: Path) -> None:
    """A row for an unknown table, or a target error, leaves the previous state intact."""
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    with pytest.raises(SchemaError, match="schema has not been received"):
        applier.apply(
            2, [entry(ins("items", 1, "a", None)), entry(ins("nope", 1))], incarnation=INC
        )
    with pytest.raises(ApplyError, match="refused"):
        applier.apply(
            2,
            [entry(ins("items", 1, "a", None)), entry(pb.Op(sql=pb.SqlStatement(sql="BOGUS")))],
            incarnation=INC,
        )
    assert rows(target, "items") == []
    assert applier.load_state().level == 1


def test_state_survives_reopen(spark: Any, applier: Applier, target: Path) -> None:
    """A new writer and applier on the same file see the level, incarnation and schemas."""
    applier.apply(1, [entry(schema_op(ITEMS)), entry(ins("items", 1, "a", None))], incarnation=INC)
    again = Applier(spark, SqliteWriter(target), subscription="sub")
    state = again.load_state()
    assert (state.level, state.incarnation, list(state.schemas)) == (2, INC, ["items"])
    again.apply(3, [entry(ins("items", 2, "b", None))], incarnation=INC)
    assert rows(target, "items") == [(1, "a", None), (2, "b", None)]
    other = Applier(spark, SqliteWriter(target), subscription="other").load_state()
    assert (other.level, other.incarnation, other.schemas) == (0, "", {})


def test_typed_values_round_trip(applier: Applier, target: Path) -> None:
    """Every logical type is stored in its documented SQLite form, exactly."""
    schema = pb.TableSchema(
        table="typed",
        columns=[
            col("k", T.COLUMN_TYPE_TEXT, nullable=False),
            col("i", T.COLUMN_TYPE_INTEGER),
            col("d", T.COLUMN_TYPE_DECIMAL),
            col("f", T.COLUMN_TYPE_FLOAT),
            col("b", T.COLUMN_TYPE_BYTES),
            col("bo", T.COLUMN_TYPE_BOOLEAN),
            col("da", T.COLUMN_TYPE_DATE),
            col("ti", T.COLUMN_TYPE_TIME),
            col("ts", T.COLUMN_TYPE_TIMESTAMP),
            col("tz", T.COLUMN_TYPE_TIMESTAMPTZ),
            col("j", T.COLUMN_TYPE_JSON),
        ],
        primary_key=["k"],
    )
    tz = dt.timezone(dt.timedelta(hours=-5, minutes=-30))
    row = (
        "x",
        2**62,
        decimal.Decimal("12345678901234567890123456789012345678.000001"),
        0.1,
        b"\x00\xff",
        True,
        dt.date(1969, 12, 31),
        dt.time(23, 59, 59, 1),
        dt.datetime(2024, 2, 29, 12, 0, 0, 5),
        dt.datetime(2024, 1, 1, 8, 0, tzinfo=tz),
        '{"a": [1, 2]}',
    )
    json_op = ins("typed", *row)
    json_op.row.row[10].CopyFrom(pb.Value(json=row[10]))
    # A text value in an INTEGER column (SQLite sources allow it) travels as variant.
    odd = ins("typed", "y", "not a number", None, None, None, None, None, None, None, None, None)
    applier.apply(1, [entry(schema_op(schema), json_op, odd)], incarnation=INC)
    assert rows(target, "typed") == [
        (
            "x",
            2**62,
            "12345678901234567890123456789012345678.000001",
            0.1,
            b"\x00\xff",
            1,
            "1969-12-31",
            "23:59:59.000001",
            "2024-02-29T12:00:00.000005",
            "2024-01-01T08:00:00-05:30",
            '{"a": [1, 2]}',
        ),
        ("y", "not a number", None, None, None, None, None, None, None, None, None),
    ]


def test_truncate_and_sql_are_barriers(applier: Applier, target: Path) -> None:
    """TRUNCATE and SQL ops run in order with the rows around them."""
    trunc = pb.Op(row=pb.RowChange(table="items", op=pb.ROW_OP_TRUNCATE))
    sql = pb.Op(sql=pb.SqlStatement(sql="UPDATE items SET name = upper(name)"))
    applier.apply(
        1,
        [
            entry(schema_op(ITEMS), ins("items", 1, "a", None), trunc, ins("items", 2, "b", None)),
            entry(sql, ins("items", 3, "c", None)),
        ],
        incarnation=INC,
    )
    assert rows(target, "items") == [(2, "B", None), (3, "c", None)]
