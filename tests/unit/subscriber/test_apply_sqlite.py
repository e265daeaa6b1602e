"""SQLite-specific apply behaviour: declared types and stored forms.

The behaviour every writer shares lives in the contract suite,
``tests/integration/subscriber/test_apply_contract.py``; this module also provides the op
builders it uses.
"""

from __future__ import annotations

import datetime as dt
import decimal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier
from subscriber.targets.sqlite import SqliteWriter
from tests.support.entries import INC, ITEMS, entry, ins, schema_op, typed_schema

pytestmark = pytest.mark.spark


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


def test_typed_values_round_trip(applier: Applier, target: Path) -> None:
    """Every logical type is stored in its documented SQLite form, exactly."""
    schema = typed_schema("typed")
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
