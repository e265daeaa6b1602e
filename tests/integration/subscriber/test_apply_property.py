"""Property: any batch split of a random stream gives the state of a one-by-one reference."""

from __future__ import annotations

import sqlite3
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import values
from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, ApplyOptions, PoisonEntryError
from subscriber.targets.sqlite import SqliteWriter

pytestmark = pytest.mark.spark

T = pb.ColumnType
R = pb.RowOp


@dataclass
class Table:
    """The reference's picture of one table: its columns and its rows by key."""

    name: str
    columns: list[str]
    types: list[int]
    key: list[str]
    rows: dict[tuple[object, ...], dict[str, object]] = field(default_factory=dict)

    def schema(self) -> pb.TableSchema:
        return pb.TableSchema(
            table=self.name,
            columns=[
                pb.Column(name=n, type=t, nullable=n not in self.key)  # type: ignore[arg-type]
                for n, t in zip(self.columns, self.types, strict=True)
            ],
            primary_key=self.key,
        )

    def key_of(self, row: dict[str, object]) -> tuple[object, ...]:
        return tuple(row[k] for k in self.key)


def reference_apply(tables: dict[str, Table], op: pb.Op) -> None:
    """Apply one op the plain way: schema ops add columns, row ops edit a dict."""
    kind = op.WhichOneof("kind")
    if kind == "schema":
        s = op.schema
        tables[s.table] = Table(
            s.table,
            [c.name for c in s.columns],
            [c.type for c in s.columns],
            list(s.primary_key),
            tables[s.table].rows if s.table in tables else {},
        )
        return
    ch = op.row
    t = tables[ch.table]
    if ch.op == R.ROW_OP_DELETE:
        t.rows.pop(tuple(values.decode(v) for v in ch.key), None)
        return
    row = dict(zip(t.columns, values.decode_row(ch.row), strict=True))
    if ch.op == R.ROW_OP_UPDATE:
        t.rows.pop(tuple(values.decode(v) for v in ch.key), None)
    t.rows[t.key_of(row)] = row


KEYS = st.integers(min_value=0, max_value=6)
VALS = st.one_of(st.none(), st.integers(-5, 5))
TEXTS = st.one_of(st.none(), st.sampled_from(["", "a", "b", "ü"]))


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[pb.Entry], list[int]]:
    """A random stream of entries (as a source would produce) and batch sizes."""
    model: dict[str, Table] = {
        "one": Table("one", ["id", "txt"], [T.COLUMN_TYPE_INTEGER, T.COLUMN_TYPE_TEXT], ["id"]),
        "two": Table(
            "two",
            ["k1", "k2", "v"],
            [T.COLUMN_TYPE_INTEGER, T.COLUMN_TYPE_TEXT, T.COLUMN_TYPE_INTEGER],
            ["k1", "k2"],
        ),
    }
    ops: list[pb.Op] = [pb.Op(schema=t.schema()) for t in model.values()]
    added = 0
    shadow: dict[str, Table] = {}
    for first in ops:
        reference_apply(shadow, first)

    def cell(ctype: int) -> object:
        return draw(VALS) if ctype == T.COLUMN_TYPE_INTEGER else draw(TEXTS)

    def new_row(t: Table) -> dict[str, object]:
        row = {n: cell(ty) for n, ty in zip(t.columns, t.types, strict=True)}
        for k in t.key:
            row[k] = draw(KEYS) if k != "k2" else draw(st.sampled_from(["x", "y"]))
        return row

    def encode(t: Table, row: dict[str, object]) -> list[pb.Value]:
        return [values.encode(row[n]) for n in t.columns]

    for _ in range(draw(st.integers(1, 40))):
        t = shadow[draw(st.sampled_from(sorted(shadow)))]
        action = draw(st.sampled_from(["insert", "update", "update", "delete", "rekey", "add"]))
        op: pb.Op | None = None
        if action == "add" and added < 2:
            added += 1
            schema = t.schema()
            schema.columns.append(
                pb.Column(name=f"extra{added}", type=T.COLUMN_TYPE_INTEGER, nullable=True)
            )
            op = pb.Op(schema=schema)
        elif action == "insert":
            row = new_row(t)
            if t.key_of(row) not in t.rows:
                op = pb.Op(row=pb.RowChange(table=t.name, op=R.ROW_OP_INSERT, row=encode(t, row)))
        elif t.rows:
            old = draw(st.sampled_from(sorted(t.rows, key=repr)))
            key = [values.encode(v) for v in old]
            if action == "delete":
                op = pb.Op(row=pb.RowChange(table=t.name, op=R.ROW_OP_DELETE, key=key))
            else:
                row = new_row(t)
                if action != "rekey":
                    row.update(dict(zip(t.key, old, strict=True)))
                if action != "rekey" or t.key_of(row) not in t.rows:
                    op = pb.Op(
                        row=pb.RowChange(
                            table=t.name, op=R.ROW_OP_UPDATE, key=key, row=encode(t, row)
                        )
                    )
        if op is not None:
            reference_apply(shadow, op)
            ops.append(op)
    # Group ops into entries, then entries into batches.
    entries: list[pb.Entry] = []
    i = 0
    while i < len(ops):
        n = draw(st.integers(1, 4))
        entries.append(pb.Entry(ops=ops[i : i + n]))
        i += n
    sizes: list[int] = []
    left = len(entries)
    while left:
        n = draw(st.integers(1, left))
        sizes.append(n)
        left -= n
    return entries, sizes


def target_rows(path: Path, table: str) -> set[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return set(conn.execute(f'SELECT * FROM "{table}"').fetchall())


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=streams())
@pytest.mark.parametrize(
    ("spark_min_rows", "ahead"),
    [(0, False), (10_000, False), (0, True)],
    ids=["spark", "driver", "planned-ahead"],
)
def test_batched_apply_equals_reference(
    spark: Any, spark_min_rows: int, ahead: bool, case: tuple[list[pb.Entry], list[int]]
) -> None:
    """Random inserts, updates, deletes, key changes and added columns, in random batches,
    leave the target exactly as applying the ops one by one does: with the net effect
    computed by a Spark job and, for small batches, in the driver; and with each batch
    planned in another thread while the one before it is written (plan ahead, as the
    subscriber does while syncing), against that batch's schemas."""
    entries, sizes = case
    reference: dict[str, Table] = {}
    for e in entries:
        for op in e.ops:
            reference_apply(reference, op)
    starts = [1 + sum(sizes[:i]) for i in range(len(sizes))]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(1) as pool:
        path = Path(tmp) / "target.db"
        options = ApplyOptions(spark_min_rows=spark_min_rows)
        applier = Applier(spark, SqliteWriter(path), subscription="prop", options=options)
        planned = applier.plan(1, entries[: sizes[0]]) if ahead else None
        for i, (seq, n) in enumerate(zip(starts, sizes, strict=True)):
            batch = entries[seq - 1 : seq - 1 + n]
            nxt = None
            if ahead and i + 1 < len(sizes):
                s1, n1 = starts[i + 1], sizes[i + 1]
                nxt = pool.submit(applier.plan, s1, entries[s1 - 1 : s1 - 1 + n1], after=planned)
            res = applier.apply(seq, batch, incarnation="i", planned=planned)
            assert res.level == seq + n - 1
            assert res.planned_ahead == ahead
            planned = nxt.result() if nxt is not None else None
        for name, t in reference.items():
            expected = {tuple(r.get(c) for c in t.columns) for r in t.rows.values()}
            assert target_rows(path, name) == expected, name


def test_a_plan_made_against_other_schemas_or_failed_is_not_used(spark: Any) -> None:
    """A batch planned ahead is written only if nothing else changed the schemas since
    (here the batch before it was applied without its plan); a plan that failed leaves
    the batch to the usual path, which stores the failing entry (policy stop)."""
    one = Table("one", ["id", "txt"], [T.COLUMN_TYPE_INTEGER, T.COLUMN_TYPE_TEXT], ["id"])

    def insert(table: str, i: int) -> pb.Entry:
        row = [values.encode(i), values.encode(f"v{i}")]
        return pb.Entry(ops=[pb.Op(row=pb.RowChange(table=table, op=R.ROW_OP_INSERT, row=row))])

    first = [pb.Entry(ops=[pb.Op(schema=one.schema())]), insert("one", 1)]
    second = [insert("one", 2), insert("one", 3)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "target.db"
        applier = Applier(spark, SqliteWriter(path), subscription="ahead")
        p1 = applier.plan(1, first)
        p2 = applier.plan(3, second, after=p1)
        assert p1.error is None
        assert p2.error is None
        assert not applier.apply(1, first, incarnation="i").planned_ahead  # p1 not passed
        res = applier.apply(3, second, incarnation="i", planned=p2)
        assert not res.planned_ahead
        assert res.level == 4
        assert target_rows(path, "one") == {(1, "v1"), (2, "v2"), (3, "v3")}

        bad = [insert("one", 5), insert("nosuch", 6)]
        p3 = applier.plan(5, bad)
        assert p3.error is not None
        assert "nosuch" in str(p3.error)
        with pytest.raises(PoisonEntryError) as caught:
            applier.apply(5, bad, incarnation="i", planned=p3)
        assert caught.value.seq == 6
        assert caught.value.level == 5
        assert target_rows(path, "one") == {(1, "v1"), (2, "v2"), (3, "v3"), (5, "v5")}
