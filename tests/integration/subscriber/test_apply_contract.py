"""The writer contract, run against every backend (SQLite, PostgreSQL) through the Applier.

Each test gets a ``backend``: a factory for fresh writers on one empty target and a
way to read a table back, with values normalised (decimals as text, booleans as 0/1,
dates and times as ISO text) so one expectation holds for every dialect.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.message import DecodeError

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import (
    Applier,
    ApplyError,
    GapError,
    PoisonEntryError,
    RawEntry,
    SchemaError,
    WriterError,
)
from subscriber.apply.writer import RowsStep
from subscriber.targets.postgres import PostgresWriter
from tests.support.backends import Backend, norm
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

pytestmark = pytest.mark.spark


@pytest.fixture
def applier(spark: Any, backend: Backend) -> Iterator[Applier]:
    writer = backend.make()
    yield Applier(spark, writer, subscription="sub")
    writer.close()


def test_insert_update_delete(applier: Applier, backend: Backend) -> None:
    """Inserts, updates and deletes over several batches leave the expected rows."""
    applier.apply(
        1,
        [
            entry(schema_op(ITEMS)),
            entry(ins("items", 1, "a", decimal.Decimal("1.10")), ins("items", 2, "b", None)),
        ],
        incarnation=INC,
    )
    assert backend.rows("items") == [(1, "a", "1.10"), (2, "b", None)]
    res = applier.apply(
        3,
        [entry(upd("items", (1,), 1, "a2", decimal.Decimal("9.99"))), entry(dele("items", 2))],
        incarnation=INC,
    )
    assert (res.level, res.rows) == (4, 2)
    assert backend.rows("items") == [(1, "a2", "9.99")]


def test_key_change_is_delete_plus_insert(applier: Applier, backend: Backend) -> None:
    """An update that changes the key removes the old key and writes the new one."""
    applier.apply(1, [entry(schema_op(ITEMS), ins("items", 1, "a", None))], incarnation=INC)
    applier.apply(2, [entry(upd("items", (1,), 7, "a", None))], incarnation=INC)
    assert backend.rows("items") == [(7, "a", None)]
    # Swap keys within one batch: 7 -> 8, then a new 7 appears.
    applier.apply(
        3,
        [entry(upd("items", (7,), 8, "moved", None)), entry(ins("items", 7, "new", None))],
        incarnation=INC,
    )
    assert backend.rows("items") == [(7, "new", None), (8, "moved", None)]


def test_same_key_many_times_in_one_batch(applier: Applier, backend: Backend) -> None:
    """The last event per key in (seq, position) order wins, even within one entry."""
    ops = [ins("items", 1, "v0", None)]
    ops += [upd("items", (1,), 1, f"v{i}", None) for i in range(1, 50)]
    ops += [dele("items", 1), ins("items", 1, "final", None), ins("items", 2, "x", None)]
    ops += [dele("items", 2)]
    res = applier.apply(
        1, [entry(schema_op(ITEMS)), entry(*ops[:20]), entry(*ops[20:])], incarnation=INC
    )
    assert res.rows == len(ops)
    assert backend.rows("items") == [(1, "final", None)]


def test_add_column_mid_stream(applier: Applier, backend: Backend) -> None:
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
    assert backend.rows("items") == [(1, "a", None, 3), (2, "b", None, 5)]
    assert len(applier.load_state().schemas["items"].columns) == 4


def test_gap_is_refused_and_changes_nothing(applier: Applier, backend: Backend) -> None:
    """A batch not starting at level + 1 raises GapError and leaves rows and level alone."""
    applier.apply(1, [entry(schema_op(ITEMS), ins("items", 1, "a", None))], incarnation=INC)
    for first in (1, 3, 100):
        with pytest.raises(GapError, match="expected seq 2"):
            applier.apply(first, [entry(ins("items", 9, "z", None))], incarnation=INC)
    with pytest.raises(GapError, match="incarnation"):
        applier.apply(2, [entry(ins("items", 9, "z", None))], incarnation="other")
    assert backend.rows("items") == [(1, "a", None)]
    assert applier.load_state().level == 1


def test_second_writer_cannot_move_the_level_twice(
    spark: Any, applier: Applier, backend: Backend
) -> None:
    """Two appliers on one subscription: the stale one is refused by the level check."""
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    other_writer = backend.make()
    other = Applier(spark, other_writer, subscription="sub")
    assert other.load_state().level == 1
    applier.apply(2, [entry(ins("items", 1, "a", None))], incarnation=INC)
    # `other` still believes the level is 1; the writer re-checks under its lock.
    with pytest.raises(GapError):
        other_writer.write("sub", INC, 2, 2, [])
    other_writer.close()
    assert backend.rows("items") == [(1, "a", None)]


def test_failed_entry_changes_nothing(applier: Applier, backend: Backend) -> None:
    """An entry with a row for an unknown table, or one the target refuses, is all-or-nothing."""
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    with pytest.raises(PoisonEntryError, match="schema has not been received") as info:
        applier.apply(2, [entry(ins("items", 1, "a", None), ins("nope", 1))], incarnation=INC)
    assert isinstance(info.value.cause, SchemaError)
    assert applier.writer.skip_error("sub", 2) == 2
    with pytest.raises(PoisonEntryError, match="refused") as info:
        applier.apply(
            3,
            [entry(ins("items", 1, "a", None), pb.Op(sql=pb.SqlStatement(sql="BOGUS")))],
            incarnation=INC,
        )
    assert isinstance(info.value.cause, WriterError)
    assert backend.rows("items") == []
    assert applier.load_state().level == 2


def test_entries_given_as_received_bytes(applier: Applier, backend: Backend) -> None:
    """Entries handed over as the bytes a feed delivered (what the daemon does) apply
    as parsed ones do, without being parsed for the walk; a poisoned one is stored
    byte for byte, and a payload that is no entry is refused and changes nothing."""
    first = [entry(schema_op(ITEMS))]
    first += [
        entry(ins("items", i, f"n{i}", None), ins("items", i + 100, "x", None))
        for i in range(1, 40)
    ]
    first += [entry(upd("items", (i,), i, f"u{i}", decimal.Decimal("2.50"))) for i in range(1, 40)]
    first += [entry(dele("items", i + 100)) for i in range(1, 40)]
    raw = [RawEntry(e.SerializeToString()) for e in first]
    res = applier.apply(1, raw, incarnation=INC)
    assert (res.level, res.rows) == (len(first), 39 * 4)
    assert backend.rows("items") == [(i, f"u{i}", "2.50") for i in range(1, 40)]
    # Read from the bytes (the numpy walk): no entry was parsed.
    assert [i for i, e in enumerate(raw) if e._parsed is not None] == []

    level = res.level
    poison = entry(ins("items", 500, "p", None), pb.Op(sql=pb.SqlStatement(sql="BOGUS")))
    payload = poison.SerializeToString()
    with pytest.raises(PoisonEntryError):
        applier.apply(level + 1, [RawEntry(payload)], incarnation=INC)
    [stored] = applier.writer.list_errors("sub")
    assert stored.entry == payload
    assert applier.writer.skip_error("sub", level + 1) == level + 1

    level += 1
    with pytest.raises(DecodeError):
        applier.apply(level + 1, [RawEntry(b"\x1a\xff\xff garbage")], incarnation=INC)
    assert applier.load_state().level == level
    assert backend.rows("items") == [(i, f"u{i}", "2.50") for i in range(1, 40)]


def test_rows_the_source_inserted_go_first_and_may_already_exist(
    applier: Applier, backend: Backend
) -> None:
    """Upserts of keys whose first event in the segment is an INSERT are marked
    fresh (a staged PostgreSQL step COPYs them straight into the table); a fresh row whose key
    is on the target after all (INSERT OR REPLACE on a SQLite source, a Publish)
    still overwrites it, and nothing else of the batch is lost."""
    applier.apply(
        1,
        [entry(schema_op(ITEMS), *[ins("items", i, f"a{i}", None) for i in range(1, 6)])],
        incarnation=INC,
    )
    inserted: list[bool] = []
    if isinstance(applier.writer, PostgresWriter):
        writer = applier.writer
        writer.small_values = 0  # the staged path: small steps upsert by statement
        real = writer._inserted

        def spy(*args: Any) -> bool:
            inserted.append(real(*args))
            return inserted[-1]

        writer._inserted = spy  # type: ignore[assignment]
    batch = [
        entry(ins("items", 6, "new", None), upd("items", (1,), 1, "changed", None)),
        entry(ins("items", 7, "x", None), upd("items", (7,), 7, "x2", None)),
        entry(ins("items", 8, "gone", None), dele("items", 8), dele("items", 2)),
        entry(upd("items", (3,), 9, "moved", None)),
        entry(ins("items", 4, "replaced", decimal.Decimal("4.00"))),  # key 4 is there
    ]
    planned = applier.plan(2, batch)
    [step] = planned.steps or []
    assert isinstance(step, RowsStep)
    assert step.fresh == 3
    assert sorted(r["c0"] for r in step.upserts.slice(0, 3).to_pylist()) == [4, 6, 7]
    assert sorted(r["c0"] for r in step.upserts.slice(3).to_pylist()) == [1, 9]
    applier.apply(2, batch, incarnation=INC)
    assert backend.rows("items") == [
        (1, "changed", None),
        (4, "replaced", "4.00"),
        (5, "a5", None),
        (6, "new", None),
        (7, "x2", None),
        (9, "moved", None),
    ]
    # Without a present key the fresh rows are inserted as they are.
    applier.apply(
        7,
        [entry(ins("items", 10, "ten", None), upd("items", (5,), 5, "five", None))],
        incarnation=INC,
    )
    assert backend.rows("items")[-2:] == [(9, "moved", None), (10, "ten", None)]
    assert (5, "five", None) in backend.rows("items")
    if isinstance(applier.writer, PostgresWriter):
        assert inserted == [False, True]


def test_state_survives_reopen(spark: Any, applier: Applier, backend: Backend) -> None:
    """A new writer and applier on the same target see the level, incarnation and schemas."""
    applier.apply(1, [entry(schema_op(ITEMS)), entry(ins("items", 1, "a", None))], incarnation=INC)
    again = Applier(spark, backend.make(), subscription="sub")
    state = again.load_state()
    assert (state.level, state.incarnation, list(state.schemas)) == (2, INC, ["items"])
    assert state.schemas["items"] == ITEMS
    again.apply(3, [entry(ins("items", 2, "b", None))], incarnation=INC)
    assert backend.rows("items") == [(1, "a", None), (2, "b", None)]
    other = Applier(spark, backend.make(), subscription="other").load_state()
    assert (other.level, other.incarnation, other.schemas) == (0, "", {})


def test_truncate_and_sql_are_barriers(applier: Applier, backend: Backend) -> None:
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
    assert backend.rows("items") == [(2, "B", None), (3, "c", None)]


def test_portable_values_round_trip(applier: Applier, backend: Backend) -> None:
    """Values every dialect stores the same way come back exactly (incl. '' vs NULL)."""
    schema = typed_schema("portable", only=("k", "i", "d", "f", "b", "da", "ts"))
    big = decimal.Decimal("12345678901234567890123456789012345678.000001")
    rows = [
        (
            "",
            -(2**63),
            big,
            0.1 + 0.2,
            b"\x00\xff",
            dt.date(1969, 12, 31),
            dt.datetime(2024, 2, 29, 12, 0, 0, 5),
        ),
        ('a,"b"\n\\.', None, None, None, None, None, None),
        (
            "\\.",
            0,
            decimal.Decimal("-0.5"),
            -1e300,
            b"",
            dt.date(2000, 1, 1),
            dt.datetime(1900, 1, 1),
        ),
    ]
    applier.apply(
        1, [entry(schema_op(schema), *(ins("portable", *r) for r in rows))], incarnation=INC
    )
    want = sorted(tuple(norm(v) for v in r) for r in rows)
    got = sorted(backend.query('SELECT * FROM "portable"'))
    # ISO text: SQLite stores 'T', PostgreSQL's datetime.isoformat() gives 'T' too.
    assert got == want


def test_error_table_record_list_skip(applier: Applier, backend: Backend) -> None:
    """record_error stores the entry whole; skip_error moves the level past it."""
    applier.apply(1, [entry(schema_op(ITEMS))], incarnation=INC)
    writer = backend.make()
    bad = entry(ins("items", 1, "a", None))
    writer.record_error("sub", INC, 2, bad.SerializeToString(), "boom", skip=False)
    with pytest.raises(GapError):  # only at level + 1
        writer.record_error("sub", INC, 5, b"", "x", skip=False)
    [stored] = writer.list_errors("sub")
    assert (stored.seq, stored.error, stored.status) == (2, "boom", "open")
    assert pb.Entry.FromString(stored.entry) == bad
    assert writer.skip_error("sub", 2) == 2
    assert [e.status for e in writer.list_errors()] == ["skipped"]
    assert applier.load_state().level == 2
    with pytest.raises(ApplyError, match="no stored error"):
        writer.skip_error("sub", 7)
    writer.close()
