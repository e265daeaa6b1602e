"""The shaping rules of publisher/shaping.py, through a real publication log: what a
shaped publication's log holds for each kind of op, whoever appends it (capture or
the Publish RPC)."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import decode, encode
from publisher.config import PublicationConfig
from publisher.errors import ShapeRefused
from publisher.log import open_log
from publisher.publication import Publication

SCHEMA = pb.TableSchema(
    table="orders",
    columns=[
        pb.Column(name="id", type=pb.COLUMN_TYPE_INTEGER),
        pb.Column(name="region", type=pb.COLUMN_TYPE_TEXT),
        pb.Column(name="amount", type=pb.COLUMN_TYPE_DECIMAL, scale=2),
        pb.Column(name="day", type=pb.COLUMN_TYPE_DATE),
        pb.Column(name="secret", type=pb.COLUMN_TYPE_TEXT),
    ],
    primary_key=["id"],
)


def _row(op: int, i: int, region: str, amount: str = "1.00", key: int | None = None) -> pb.Op:
    rc = pb.RowChange(table="orders", op=op)  # type: ignore[arg-type]
    if key is not None:
        rc.key.append(encode(key))
    rc.row.extend(
        [
            encode(i),
            encode(region),
            encode(decimal.Decimal(amount)),
            encode(dt.date(2026, 1, i)),
            encode(f"SECRET-{i}"),
        ]
    )
    return pb.Op(row=rc)


@pytest.fixture
def pub(tmp_path: Path) -> Iterator[Publication]:
    config = PublicationConfig(
        name="shop",
        tables=["orders", "other"],
        filter={"orders": "region = 'eu' AND amount > 10 AND day >= '2026-01-02'"},
        columns={"orders": ["id", "region", "amount", "day"]},
    )
    log = open_log(tmp_path / "log")
    yield Publication(config, log)
    log.close()


def _logged(pub: Publication) -> list[pb.Op]:
    return [op for p in pub.log.read(1, max_entries=100) for op in pb.Entry.FromString(p).ops]


def test_each_kind_of_op_is_shaped_before_the_log(pub: Publication) -> None:
    """Schema projected; inserts outside the filter dropped (decimals compared as
    numbers, dates as ISO text); an update outside it becomes a delete of its key; a
    delete and a truncate pass; another table is untouched; no secret in the log."""
    other = pb.Op(row=pb.RowChange(table="other", op=pb.ROW_OP_INSERT, row=[encode("x")]))
    pub.append(
        pb.Entry(
            ops=[
                pb.Op(schema=SCHEMA),
                _row(pb.ROW_OP_INSERT, 2, "eu", "10.50"),  # in
                _row(pb.ROW_OP_INSERT, 3, "eu", "9.99"),  # amount out
                _row(pb.ROW_OP_INSERT, 1, "eu", "50.00"),  # day out
                _row(pb.ROW_OP_INSERT, 4, "us", "50.00"),  # region out
                _row(pb.ROW_OP_UPDATE, 2, "us", key=2),  # leaves: delete of 2
                _row(pb.ROW_OP_UPDATE, 5, "eu", "11.00", key=5),  # in
                pb.Op(row=pb.RowChange(table="orders", op=pb.ROW_OP_DELETE, key=[encode(7)])),
                other,
                pb.Op(row=pb.RowChange(table="orders", op=pb.ROW_OP_TRUNCATE)),
            ]
        )
    )
    ops = _logged(pub)
    assert [c.name for c in ops[0].schema.columns] == ["id", "region", "amount", "day"]
    rows = [(op.row.op, [decode(v) for v in op.row.key], [decode(v) for v in op.row.row])
            for op in ops[1:] if op.row.table == "orders"]  # fmt: skip
    assert rows == [
        (pb.ROW_OP_INSERT, [], [2, "eu", decimal.Decimal("10.50"), dt.date(2026, 1, 2)]),
        (pb.ROW_OP_DELETE, [2], []),
        (pb.ROW_OP_UPDATE, [5], [5, "eu", decimal.Decimal("11.00"), dt.date(2026, 1, 5)]),
        (pb.ROW_OP_DELETE, [7], []),
        (pb.ROW_OP_TRUNCATE, [], []),
    ]
    assert other in ops
    assert b"SECRET" not in b"".join(pub.log.read(1, max_entries=100))


def test_a_row_before_its_schema_is_refused_and_nothing_is_logged(pub: Publication) -> None:
    """Fail closed: a row of a shaped table whose schema was not seen is not published."""
    with pytest.raises(ShapeRefused, match="before its schema"):
        pub.append(pb.Entry(ops=[_row(pb.ROW_OP_INSERT, 2, "eu", "99.00")]))
    assert pub.log.head == 0


def test_a_schema_without_a_filtered_column_is_refused(pub: Publication) -> None:
    """The source dropped a column the filter names: the schema op is refused by name."""
    schema = pb.TableSchema()
    schema.CopyFrom(SCHEMA)
    del schema.columns[2]  # amount
    with pytest.raises(ShapeRefused, match="amount"):
        pub.append(pb.Entry(ops=[pb.Op(schema=schema)]))
    assert pub.log.head == 0


def test_config_refuses_shaping_of_a_table_it_does_not_publish() -> None:
    """``filter``/``columns`` of a table not in ``tables``, or empty, name the problem."""
    with pytest.raises(ValueError, match="not in this publication's tables"):
        PublicationConfig(name="p", tables=["a"], filter={"b": "x = 1"})
    with pytest.raises(ValueError, match="empty"):
        PublicationConfig(name="p", tables=["a"], columns={"a": []})
