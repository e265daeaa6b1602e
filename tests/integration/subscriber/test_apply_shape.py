"""Transforms (rename, drop, computed, filter, target name) and history mode, on every backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, ApplyOptions, TableOptions, Writer
from tests.support.backends import Backend
from tests.support.entries import INC, ITEMS, dele, entry, ins, schema_op, upd

pytestmark = pytest.mark.spark


@pytest.fixture
def writer(backend: Backend) -> Iterator[Writer]:
    w = backend.make()
    yield w
    w.close()


def test_transforms(spark: Any, writer: Writer, backend: Backend) -> None:
    """Renamed, dropped and computed columns, another table name; rows leaving the filter go."""
    opts = TableOptions(
        target="goods",
        rename={"name": "title"},
        drop=("price",),
        computed={"shout": "upper(name)", "id2": "id * 2"},
        filter="name <> 'hidden'",
    )
    applier = Applier(spark, writer, "sub", options=ApplyOptions(tables={"items": opts}))
    applier.apply(
        1,
        [
            entry(schema_op(ITEMS), ins("items", 1, "a", None), ins("items", 2, "b", None)),
            entry(ins("items", 3, "hidden", None)),
        ],
        incarnation=INC,
    )
    assert backend.rows("goods") == [(1, "a", "A", 2), (2, "b", "B", 4)]
    # Row 2 leaves the filter (deleted on the target), row 3 enters it, row 1 is deleted.
    applier.apply(
        3,
        [
            entry(upd("items", (2,), 2, "hidden", None), upd("items", (3,), 3, "c", None)),
            entry(dele("items", 1)),
        ],
        incarnation=INC,
    )
    assert backend.rows("goods") == [(3, "c", "C", 6)]
    assert backend.query("SELECT count(*) FROM txrepl_schemas WHERE table_name = 'items'") == [(1,)]


def reference_history(entries: list[pb.Entry]) -> list[tuple[Any, ...]]:
    """History the plain way: per entry, the last op per key is a version."""
    rows: dict[tuple[object, int], list[Any]] = {}
    current: dict[object, int] = {}
    for seq, e in enumerate(entries, start=1):
        last: dict[object, tuple[str, list[Any]]] = {}
        for op in e.ops:
            if op.WhichOneof("kind") != "row":
                continue
            ch = op.row
            if ch.op == pb.ROW_OP_DELETE:
                k = ch.key[0].int
                last[k] = ("D", [k, None, None])
            else:
                new = [ch.row[0].int, ch.row[1].text, None]
                if ch.op == pb.ROW_OP_UPDATE and ch.key[0].int != new[0]:
                    last[ch.key[0].int] = ("D", [ch.key[0].int, None, None])
                last[new[0]] = ("I" if ch.op == pb.ROW_OP_INSERT else "U", new)
        for key, (letter, vals) in last.items():
            if key in current:
                rows[(key, current[key])][4] = seq - 1
            rows[(key, seq)] = [*vals, seq, None, letter, f"1970-01-01T00:00:00.{seq:06d}"]
            current[key] = seq
    return [tuple(rows[k]) for k in sorted(rows, key=lambda k: (k[0], k[1]))]


def test_history_mode_against_reference(spark: Any, writer: Writer, backend: Backend) -> None:
    """Every version is kept with its seq range, op and commit time, as a reference computes."""
    stream = [
        entry(schema_op(ITEMS), ins("items", 1, "a", None)),
        entry(ins("items", 2, "b", None), upd("items", (1,), 1, "a1", None)),
        entry(upd("items", (1,), 1, "a2", None), upd("items", (1,), 1, "a3", None)),
        entry(dele("items", 2), upd("items", (1,), 5, "moved", None)),
        entry(ins("items", 2, "again", None)),
        entry(upd("items", (5,), 5, "x", None)),
    ]
    for i, e in enumerate(stream, start=1):
        e.commit_time_us = i
    opts = ApplyOptions(tables={"items": TableOptions(history=True)})
    applier = Applier(spark, writer, "sub", options=opts)
    applier.apply(1, stream[:2], incarnation=INC)  # batch boundaries inside the history
    applier.apply(3, stream[2:5], incarnation=INC)
    applier.apply(6, stream[5:], incarnation=INC)
    got = backend.query(
        'SELECT id, name, price, _first_seq, _last_seq, _op, "_commit_time" FROM items'
        " ORDER BY id, _first_seq"
    )
    # Commit times: SQLite stores ISO text, PostgreSQL a timestamp (normalised to ISO).
    got = [(*r[:6], str(r[6]).replace(" ", "T")) for r in got]
    assert got == reference_history(stream)
