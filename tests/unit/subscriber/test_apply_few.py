"""The plan of a small batch in plain Python (subscriber/apply/_few.py) against the
vectorized plan it stands in for: the same steps, exactly, on seeded in-sync batches
over every column type (tests/support/plan_batches.py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import _events, _few, engine
from subscriber.apply.entry import RawEntry
from subscriber.apply.options import ApplyOptions, TableOptions
from subscriber.apply.writer import RowsStep
from tests.support import plan_batches


class NoSpark(engine.Applier):
    """An Applier without Spark or target: below ``spark_min_rows`` a plain table's net
    effect needs neither; a table with transforms or history (not planned by the small
    path) keeps the events it was handed."""

    def __init__(self, options: ApplyOptions) -> None:
        super().__init__(None, None, "sub", options=options)  # type: ignore[arg-type]

    def _rows_step(self, buf: Any, first_seq: int, commit_times: pa.Array) -> Any:
        return ("shaped", buf.schema, buf.to_arrow(), commit_times.to_pylist())


@contextmanager
def vectorized() -> Iterator[None]:
    """The plan as it was before the small path: numpy walk, numpy decoding, Arrow's
    group-by and takes (the thresholds of ``_few.py`` and ``_events.py`` at 0)."""
    saved = _few.FEW_OPS, _events.FEW_EVENTS
    _few.FEW_OPS, _events.FEW_EVENTS = 0, 0
    try:
        yield
    finally:
        _few.FEW_OPS, _events.FEW_EVENTS = saved


def _cell(v: object) -> object:
    """A cell compared exactly: floats by their bits (-0.0, NaN), the rest as is."""
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, dict):
        return {k: _cell(x) for k, x in v.items()}
    return v


def _table(t: pa.Table) -> tuple[pa.Schema, list[dict[str, object]]]:
    return t.schema, [{k: _cell(v) for k, v in row.items()} for row in t.to_pylist()]


def _step(step: Any) -> Any:
    if isinstance(step, RowsStep):
        return ("rows", step.schema, _table(step.deletes), _table(step.upserts), step.fresh)
    if isinstance(step, tuple) and step[0] == "shaped":
        return (*step[:2], _table(step[2]), step[3])
    return step


def _plan(
    options: ApplyOptions, first_seq: int, entries: list[Any], schemas: dict[str, pb.TableSchema]
) -> tuple[Any, ...]:
    mine = dict(schemas)
    steps, rows = NoSpark(options)._plan(first_seq, entries, mine)
    return [_step(s) for s in steps], rows, mine


OPTIONS = [
    ApplyOptions(),
    ApplyOptions(commit_times=True),
    ApplyOptions(  # tables left to the vectorized path, and a renamed plain one
        commit_times=True,
        tables={
            "t_2": TableOptions(history=True),
            "t_3": TableOptions(rename={"i": "i2"}),
            "t_4": TableOptions(target="t_4_copy"),
        },
    ),
]


@pytest.mark.parametrize("seed", range(300))
def test_small_batches_plan_as_the_vectorized_path(seed: int) -> None:
    rng = random.Random(seed)
    schemas = plan_batches.schemas()
    entries: list[Any] = plan_batches.small_batch(rng, schemas)
    if seed % 2:  # as a feed delivers them
        entries = [RawEntry(e.SerializeToString()) for e in entries]
    options = OPTIONS[seed % len(OPTIONS)]
    first_seq = rng.randint(1, 10**6)
    assert _few.few_entries(entries) is not None  # the small path is taken
    small = _plan(options, first_seq, entries, schemas)
    with vectorized():
        assert _few.few_entries(entries) is None
        reference = _plan(options, first_seq, entries, schemas)
    assert small == reference


def test_nan_and_signed_zero_keys_are_one_key_each() -> None:
    """Spark groups every NaN together and -0.0 with 0.0: so does the small path,
    keeping the last event of each and the insert that began it (``fresh``)."""
    schema = pb.TableSchema(
        table="t",
        columns=[
            pb.Column(name="f", type=pb.ColumnType.COLUMN_TYPE_FLOAT),
            pb.Column(name="v", type=pb.ColumnType.COLUMN_TYPE_INTEGER),
        ],
        primary_key=["f"],
    )
    nan2 = plan_batches._NEG_NAN

    def ins(f: float, v: int) -> pb.Op:
        row = [pb.Value(float=f), pb.Value(int=v)]
        return pb.Op(row=pb.RowChange(table="t", op=pb.ROW_OP_INSERT, row=row))

    entries = [pb.Entry(ops=[ins(float("nan"), 1), ins(0.0, 2), ins(nan2, 3), ins(-0.0, 4)])]
    steps, rows, _ = _plan(ApplyOptions(), 5, entries, {"t": schema})
    [(kind, _, deletes, upserts, fresh)] = steps
    assert (kind, rows, fresh) == ("rows", 4, 2)
    assert deletes[1] == []
    assert [r["c1"] for r in upserts[1]] == [3, 4]
    with vectorized():
        assert _plan(ApplyOptions(), 5, entries, {"t": schema})[0] == steps
