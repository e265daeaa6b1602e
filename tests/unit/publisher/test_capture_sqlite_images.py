"""SQLite capture's row images: a value costs its own size, travels exactly, old rows still read."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import RawText, decode
from publisher.capture.sqlite import SqliteCapture
from publisher.errors import RowTooLarge


def _source(tmp_path: Path, ddl: str) -> sqlite3.Connection:
    conn = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(ddl)
    return conn


def _ops(cap: SqliteCapture, after: int = 0) -> list[tuple[str, list[object], list[object]]]:
    rows = cap.read(after)
    entry, _ = cap.build_entry("p", rows, after, cap.installed()["p"])
    assert entry is not None
    return [
        (pb.RowOp.Name(op.row.op), [decode(v) for v in op.row.key], [decode(v) for v in op.row.row])
        for op in entry.ops
        if op.HasField("row")
    ]


def test_a_large_value_costs_its_own_size_in_the_capture_table(tmp_path: Path) -> None:
    """Capture writes a 100 KB text or blob once more, not doubled by quoting or escaping."""
    src = _source(tmp_path, "CREATE TABLE docs(id INTEGER PRIMARY KEY, body TEXT, data BLOB)")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["docs"])
    text = "'\"\\\x01\n" * 20_000  # quotes, a backslash, control characters: 100 KB
    blob = bytes(range(256)) * 400
    src.execute("INSERT INTO docs VALUES (1, ?, ?)", (text, blob))
    src.execute("UPDATE docs SET body = ? WHERE id = 1", (text[::-1],))
    sizes = [
        n for (n,) in src.execute("SELECT length(v) FROM _txrepl_capture WHERE op IN ('I', 'U')")
    ]
    assert len(sizes) == 2
    assert all(n <= len(text) + len(blob) + 64 for n in sizes), sizes
    assert _ops(cap)[-2:] == [
        ("ROW_OP_INSERT", [], [1, text, blob]),
        ("ROW_OP_UPDATE", [1], [1, text[::-1], blob]),
    ]


VALUES: list[object] = [
    None,
    0,
    -(2**63),
    2**63 - 1,
    1 / 3,
    1e300,
    math.inf,
    -math.inf,
    "",
    "a:b,c",
    "t3:xyz",
    "b0:",
    "NULL,",
    "x\x00y",
    "é😀",
    b"",
    b"\x00",
    b"t1:,",
]


def test_every_storage_class_is_exact_through_copy_insert_update_and_delete(
    tmp_path: Path,
) -> None:
    """Rows copied at install, inserted, updated with a key change, deleted: values as stored."""
    src = _source(tmp_path, "CREATE TABLE v(id INTEGER PRIMARY KEY, x, k TEXT)")
    src.execute("INSERT INTO v VALUES (0, CAST(X'41FF3A2C' AS TEXT), 'before')")  # not UTF-8
    for i, value in enumerate(VALUES, start=1):
        src.execute("INSERT INTO v VALUES (?, ?, 'before')", (i, value))
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["v"])  # copies the rows
    after = cap.max_id()
    src.execute("INSERT INTO v SELECT id + 100, x, 'after' FROM v")  # through the trigger
    src.execute("UPDATE v SET id = id + 1000 WHERE id < 100")  # the old key travels in k
    src.execute("DELETE FROM v WHERE id >= 1000")
    expected = [RawText(b"A\xff:,"), *VALUES]
    assert _ops(cap)[: len(expected)] == [
        ("ROW_OP_INSERT", [], [i, x, "before"]) for i, x in enumerate(expected)
    ]
    assert _ops(cap, after) == [
        *[("ROW_OP_INSERT", [], [i + 100, x, "after"]) for i, x in enumerate(expected)],
        *[("ROW_OP_UPDATE", [i], [i + 1000, x, "before"]) for i, x in enumerate(expected)],
        *[("ROW_OP_DELETE", [i + 1000], []) for i in range(len(expected))],
    ]


def test_rows_an_older_build_wrote_as_json_still_decode_and_its_triggers_are_rebuilt(
    tmp_path: Path,
) -> None:
    """A source upgraded with capture rows and triggers of the JSON format: every row exact."""
    src = _source(tmp_path, "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, ratio REAL)")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["t"])
    (gen,) = src.execute("SELECT max(gen) FROM _txrepl_shapes").fetchone()
    after = cap.max_id()
    # What the previous build's triggers wrote, and an insert trigger of that build's form.
    src.execute(
        "INSERT INTO _txrepl_capture(tbl, op, k, v, gen) VALUES ('t', 'U',"
        " json_array(quote(1)), json_array(quote(1), quote('it''s'), quote(0.1)), ?),"
        " ('t', 'I', NULL, json_array(quote(2), 't' || quote(CAST('a' || char(0) AS BLOB)),"
        " quote(NULL)), ?)",
        (gen, gen),
    )
    src.execute("DROP TRIGGER _txrepl_i_t")
    src.execute(
        "CREATE TRIGGER _txrepl_i_t AFTER INSERT ON t BEGIN INSERT INTO _txrepl_capture"
        "(tbl, op, k, v, gen) VALUES ('t', 'I', NULL, json_array(quote(NEW.id),"
        f" quote(NEW.name), quote(NEW.ratio)), {gen}); END"
    )
    src.execute("INSERT INTO t VALUES (3, 'c', 2.5)")
    cap.close()
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["t"])  # a restart on the new build
    src.execute("INSERT INTO t VALUES (4, 'd', 1e300)")
    assert _ops(cap, after) == [
        ("ROW_OP_UPDATE", [1], [1, "it's", 0.1]),
        ("ROW_OP_INSERT", [], [2, "a\x00", None]),
        ("ROW_OP_INSERT", [], [3, "c", 2.5]),
        ("ROW_OP_INSERT", [], [4, "d", 1e300]),
    ]
    kinds = [
        k for (k,) in src.execute("SELECT typeof(v) FROM _txrepl_capture WHERE id > ?", (after,))
    ]
    assert kinds == ["text", "text", "text", "blob"]  # the last by the rebuilt trigger


def test_a_row_too_large_is_named_by_a_key_stored_after_its_large_value(tmp_path: Path) -> None:
    """The key of an image too large to read is found by reading the image piece by piece."""
    src = _source(tmp_path, "CREATE TABLE d(body TEXT, a TEXT, b INTEGER, PRIMARY KEY (a, b))")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["d"])
    after = cap.max_id()
    src.execute("INSERT INTO d VALUES (?, 'k:1,', 7)", ("x" * 50_000,))
    rows = cap.read(after, max_bytes=10_000)
    with pytest.raises(RowTooLarge) as raised:
        cap.build_entries("p", rows, after, cap.installed()["p"], 10_000)
    assert "a='k:1,'" in str(raised.value)
    assert "b=7" in str(raised.value)
