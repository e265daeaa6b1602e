"""A few events' rows step kept as plain values (subscriber/apply/_plain.py) against
the Arrow tables it stands in for: seeded in-sync batches of every type at its
extremes, and what each target is handed from either (PostgreSQL's parameter text,
SQLite's bound values) compared exactly."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import engine
from subscriber.apply._plain import FewRows
from subscriber.apply.options import ApplyOptions
from subscriber.apply.writer import RowsStep, column_of
from subscriber.targets.postgres import _pipeline
from subscriber.targets.sqlite import writer as sqlite_writer
from tests.unit.subscriber import plain_batches


class NoSpark(engine.Applier):
    """An Applier without Spark or target: a small batch of plain tables needs neither."""

    def __init__(self) -> None:
        super().__init__(None, None, "sub", options=ApplyOptions())  # type: ignore[arg-type]


def _exact(v: object) -> object:
    """A cell compared exactly: floats by their bits (-0.0, NaN payloads)."""
    return ("float", v.hex()) if isinstance(v, float) else v


def _exact_all(cells: list[Any]) -> list[Any]:
    return [_exact(v) for v in cells]


def _arrow_twin(step: FewRows) -> RowsStep:
    """The same step as the plain RowsStep of its Arrow tables (what the writers
    were handed before)."""
    return RowsStep(step.schema, step.deletes, step.upserts, fresh=step.fresh)


def _steps(seed: int, variants: bool = False) -> list[RowsStep]:
    rng = random.Random(seed)
    schemas = plain_batches.schemas()
    entries = plain_batches.batch(rng, schemas, variants)
    steps, _ = NoSpark()._plan(rng.randint(1, 10**6), entries, dict(schemas))
    return [s for s in steps if isinstance(s, RowsStep)]


def _kinds(step: RowsStep) -> list[tuple[bool, list[int]]]:
    names = [c.name for c in step.schema.columns]
    keys = [names.index(k) for k in step.schema.primary_key]
    return [(False, keys), (True, list(range(len(names))))]


@pytest.mark.parametrize("seed", range(400))
def test_plain_rows_hand_each_target_what_the_arrow_tables_hand_it(seed: int) -> None:
    """Every type at its extremes, same-key chains, key changes, deletes and re-inserts:
    the plain values equal the Arrow columns' values, and PostgreSQL's parameter text
    and SQLite's bound values made from them equal those made from the Arrow tables."""
    steps = _steps(seed)
    assert steps
    assert all(isinstance(s, FewRows) for s in steps)
    for step in steps:
        assert isinstance(step, FewRows)
        twin = _arrow_twin(step)
        assert step.counts() == twin.counts()
        for upserts, indexes in _kinds(step):
            plain = step.columns(upserts, indexes)
            assert plain is not None
            table = twin.upserts if upserts else twin.deletes
            for values, i in zip(plain, indexes, strict=True):
                arrow = column_of(table, i)[0].to_pylist()
                assert _exact_all(values) == _exact_all(arrow), step.schema.columns[i].name
            assert _pipeline._step_texts(step, upserts, indexes) == _pipeline._step_texts(
                twin, upserts, indexes
            )
            got = sqlite_writer._step_values(step, upserts, indexes)
            want = sqlite_writer._step_values(twin, upserts, indexes)
            assert [_exact_all(c) for c in got] == [_exact_all(c) for c in want]


@pytest.mark.parametrize("seed", range(100))
def test_a_variant_cell_sends_its_step_the_arrow_way(seed: int) -> None:
    """A cell not of its column's kind: that step is built in Arrow, as before (its
    variant column's text comes from the cell's decoded value); the others stay plain."""
    for step in _steps(seed, variants=True):
        names = step.deletes.column_names + step.upserts.column_names
        variant = any(n.startswith("v") and n[1:].isdigit() for n in names)
        assert isinstance(step, FewRows) != variant
        assert step.columns(True, [0]) is None or not variant


def test_a_date_beyond_python_s_range_sends_its_step_the_arrow_way() -> None:
    """A DATE after 9999-12-31 has no ``datetime.date``: the step is built in Arrow."""
    schema = pb.TableSchema(
        table="d",
        columns=[
            pb.Column(name="k", type=pb.ColumnType.COLUMN_TYPE_INTEGER),
            pb.Column(name="da", type=pb.ColumnType.COLUMN_TYPE_DATE, nullable=True),
        ],
        primary_key=["k"],
    )
    row = [pb.Value(int=1), pb.Value(date=3_000_000)]
    ins = pb.Op(row=pb.RowChange(table="d", op=pb.ROW_OP_INSERT, row=row))
    steps, _ = NoSpark()._plan(1, [pb.Entry(ops=[ins])], {"d": schema})
    [step] = steps
    assert isinstance(step, RowsStep)
    assert not isinstance(step, FewRows)
    assert step.upserts.column("c1").type == pa.date32()
