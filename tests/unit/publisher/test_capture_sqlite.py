"""SQLite trigger capture: exact values, whole transactions, snapshot on install."""

from __future__ import annotations

import decimal
import sqlite3
from pathlib import Path

import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import RawText, decode
from publisher.capture.sqlite import SqliteCapture, parse_sql_literal
from publisher.errors import SourceError


def _source(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, price DECIMAL(10,2), "
        "ratio REAL, data BLOB, flag BOOLEAN, day DATE)"
    )
    return conn


def _rows(entry: pb.Entry) -> list[tuple[str, list[object], list[object]]]:
    out = []
    for op in entry.ops:
        if op.HasField("row"):
            out.append(
                (
                    pb.RowOp.Name(op.row.op),
                    [decode(v) for v in op.row.key],
                    [decode(v) for v in op.row.row],
                )
            )
    return out


def test_parse_sql_literal_round_trips_quote(tmp_path: Path) -> None:
    """Every value SQLite's quote() renders parses back to the identical value."""
    conn = sqlite3.connect(":memory:")
    values = [None, 0, -(2**63), 2**63 - 1, 1 / 3, 1e300, -0.5, "it's", "", b"\x00\xff", "x\ny"]
    for v in values:
        (lit,) = conn.execute("SELECT quote(?)", (v,)).fetchone()
        assert parse_sql_literal(lit) == v


def test_install_snapshots_existing_rows_then_captures_changes(tmp_path: Path) -> None:
    """Existing rows come first (after the schema), then later changes, all exact."""
    src = _source(tmp_path)
    src.execute("INSERT INTO t VALUES (1, 'a', 12.5, 0.1, x'00ff', 1, '2024-02-29')")
    cap = SqliteCapture(tmp_path / "src.db")
    assert cap.install("p", "inc-1", ["t"]) == ["t"]
    src.execute("BEGIN")
    src.execute("UPDATE t SET name = 'b', id = 2 WHERE id = 1")
    src.execute("INSERT INTO t VALUES (3, 'c', '7', 2.5, NULL, 0, NULL)")
    src.execute("COMMIT")
    src.execute("DELETE FROM t WHERE id = 3")
    rows = cap.read(0)
    entry, last = cap.build_entry("p", rows, 0, cap.installed()["p"])
    assert entry is not None
    assert last == rows[-1].id
    assert entry.source_position == str(last)
    assert entry.ops[0].HasField("schema")
    schema = entry.ops[0].schema
    assert list(schema.primary_key) == ["id"]
    assert [c.type for c in schema.columns][:3] == [
        pb.COLUMN_TYPE_INTEGER,
        pb.COLUMN_TYPE_TEXT,
        pb.COLUMN_TYPE_DECIMAL,
    ]
    import datetime as dt

    assert _rows(entry) == [
        (
            "ROW_OP_INSERT",
            [],
            [1, "a", decimal.Decimal("12.50"), 0.1, b"\x00\xff", True, dt.date(2024, 2, 29)],
        ),
        (
            "ROW_OP_UPDATE",
            [1],
            [2, "b", decimal.Decimal("12.50"), 0.1, b"\x00\xff", True, dt.date(2024, 2, 29)],
        ),
        ("ROW_OP_INSERT", [], [3, "c", decimal.Decimal("7.00"), 2.5, None, False, None]),
        ("ROW_OP_DELETE", [3], []),
    ]


def test_text_with_nul_or_not_utf8_and_extreme_integers_are_captured_exactly(
    tmp_path: Path,
) -> None:
    """TEXT holding a NUL (quote() stops at it), TEXT that is not UTF-8 (it stopped the
    capture: "Could not decode to UTF-8"), and integers beyond 2^53, in triggers and in
    the install copy, as keys and as values."""
    src = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    src.execute("CREATE TABLE t(k TEXT PRIMARY KEY, v)")
    src.execute("INSERT INTO t VALUES (?, CAST(X'41FF' AS TEXT))", ("a\x00b",))
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["t"])
    src.execute("INSERT INTO t VALUES (CAST(X'80' AS TEXT), 9007199254740993)")
    src.execute("UPDATE t SET v = ? WHERE k = ?", ("x\x00", "a\x00b"))
    entry, _ = cap.build_entry("p", cap.read(0), 0, cap.installed()["p"])
    assert entry is not None
    assert _rows(entry) == [
        ("ROW_OP_INSERT", [], ["a\x00b", RawText(b"A\xff")]),
        ("ROW_OP_INSERT", [], [RawText(b"\x80"), 2**53 + 1]),
        ("ROW_OP_UPDATE", ["a\x00b"], ["a\x00b", "x\x00"]),
    ]
    assert entry.ops[1].row.row[1].WhichOneof("kind") == "text_bytes"


def test_values_a_coercion_would_change_travel_as_stored(tmp_path: Path) -> None:
    """In NUMERIC-affinity columns only lossless coercions happen: 'true', a timestamp
    with a space, a real the scale would round and a number-like text stay as stored."""
    src = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, f BOOLEAN, ts TIMESTAMP, d DECIMAL(10,2))")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["t"])
    src.execute("INSERT INTO t VALUES (1, 'true', '2024-02-29 12:34:56', 12.345)")
    src.execute("INSERT INTO t VALUES (2, 1, '2024-02-29T12:34:56', 'NaN')")
    entry, _ = cap.build_entry("p", cap.read(0), 0, cap.installed()["p"])
    assert entry is not None
    import datetime as dt

    assert _rows(entry) == [
        ("ROW_OP_INSERT", [], [1, "true", "2024-02-29 12:34:56", 12.345]),
        ("ROW_OP_INSERT", [], [2, True, dt.datetime(2024, 2, 29, 12, 34, 56), "NaN"]),
    ]


def test_a_real_beyond_64_bits_in_an_integer_column_is_captured_as_a_real(
    tmp_path: Path,
) -> None:
    """INTEGER affinity keeps a REAL it cannot store as a 64-bit integer: the capture
    carried it as that integer and failed on every poll ("Value out of range")."""
    src = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER)")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["t"])
    src.execute("INSERT INTO t VALUES (1, 1e300), (2, 9.3e18), (3, 4.0)")
    entry, _ = cap.build_entry("p", cap.read(0), 0, cap.installed()["p"])
    assert entry is not None
    assert _rows(entry) == [
        ("ROW_OP_INSERT", [], [1, 1e300]),
        ("ROW_OP_INSERT", [], [2, 9.3e18]),
        ("ROW_OP_INSERT", [], [3, 4]),
    ]
    assert [op.row.row[1].WhichOneof("kind") for op in entry.ops[1:]] == ["float", "float", "int"]


def test_rows_before_installation_and_other_publications_are_excluded(tmp_path: Path) -> None:
    """A publication gets only its own snapshot and changes after its installation."""
    src = _source(tmp_path)
    src.execute("INSERT INTO t(id, name) VALUES (1, 'a')")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p1", "i1", ["t"])
    src.execute("INSERT INTO t(id, name) VALUES (2, 'b')")
    cap.install("p2", "i2", ["t"])
    src.execute("INSERT INTO t(id, name) VALUES (3, 'c')")
    rows = cap.read(0)
    inst = cap.installed()
    e1, _ = cap.build_entry("p1", rows, 0, inst["p1"])
    e2, _ = cap.build_entry("p2", rows, 0, inst["p2"])
    assert e1 is not None
    assert e2 is not None
    ids1 = [r[2][0] for r in _rows(e1)]
    ids2 = [r[2][0] for r in _rows(e2)]
    assert ids1 == [1, 2, 3]
    assert sorted(int(str(i)) for i in ids2[:2]) == [1, 2]
    assert ids2[2:] == [3]


def test_reinstall_same_incarnation_adds_nothing_new_incarnation_snapshots_again(
    tmp_path: Path,
) -> None:
    src = _source(tmp_path)
    src.execute("INSERT INTO t(id) VALUES (1)")
    cap = SqliteCapture(tmp_path / "src.db")
    assert cap.install("p", "i1", ["t"]) == ["t"]
    assert cap.install("p", "i1", ["t"]) == []
    assert cap.install("p", "i2", ["t"]) == ["t"]


def test_release_deletes_logged_rows_only(tmp_path: Path) -> None:
    src = _source(tmp_path)
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "i", ["t"])
    for i in range(5):
        src.execute("INSERT INTO t(id) VALUES (?)", (i,))
    rows = cap.read(0)
    cap.release(rows[2].id)
    assert [r.id for r in cap.read(0)] == [r.id for r in rows[3:]]


def test_table_without_primary_key_is_refused_by_name(tmp_path: Path) -> None:
    src = _source(tmp_path)
    src.execute("CREATE TABLE nokey(a, b)")
    cap = SqliteCapture(tmp_path / "src.db")
    with pytest.raises(SourceError, match=r"'nokey'.*no PRIMARY KEY"):
        cap.install("p", "i", ["nokey"])
    # nothing was installed: the transaction rolled back
    assert cap.installed() == {}


def test_missing_table_is_refused_by_name(tmp_path: Path) -> None:
    _source(tmp_path)
    cap = SqliteCapture(tmp_path / "src.db")
    with pytest.raises(SourceError, match="'ghost' does not exist"):
        cap.install("p", "i", ["t", "ghost"])
    assert cap.installed() == {}


def _ops(entry: pb.Entry | None) -> list[object]:
    """Each op as ('S', column names) or (op name, key, row)."""
    out: list[object] = []
    for op in entry.ops if entry is not None else []:
        if op.HasField("schema"):
            out.append(("S", [c.name for c in op.schema.columns]))
        else:
            row = op.row
            key, vals = [decode(v) for v in row.key], [decode(v) for v in row.row]
            out.append((pb.RowOp.Name(row.op)[7:], key, vals))
    return out


def test_alter_table_succeeds_and_each_row_keeps_its_shape(tmp_path: Path) -> None:
    """ADD / DROP / RENAME COLUMN on a captured table succeed in the application; rows
    keep the shape they were written in, and the new schema plus a copy of the table
    (carrying ADD COLUMN's default) come before the first row of the new shape."""
    src = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT, c TEXT)")
    src.execute("INSERT INTO t VALUES (1, 'a1', 'c1')")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "i", ["t"])
    pos = 0

    def poll() -> list[object]:
        nonlocal pos
        entry, pos = cap.build_entry("p", cap.read(pos), pos, cap.installed()["p"])
        return _ops(entry)

    assert poll() == [("S", ["id", "a", "c"]), ("INSERT", [], [1, "a1", "c1"])]
    src.executescript(
        "BEGIN; ALTER TABLE t ADD COLUMN d TEXT DEFAULT 'dd';"
        " INSERT INTO t VALUES (2, 'a2', 'c2', 'd2'); COMMIT;"
    )
    assert poll() == [
        ("INSERT", [], [2, "a2", "c2"]),  # written by the old triggers: the old shape
        ("S", ["id", "a", "c", "d"]),
        ("INSERT", [], [1, "a1", "c1", "dd"]),  # the default, which no trigger saw
        ("INSERT", [], [2, "a2", "c2", "d2"]),
    ]
    src.execute("ALTER TABLE t DROP COLUMN c")  # failed: "no such column: NEW.c"
    src.execute("ALTER TABLE t RENAME COLUMN a TO b")
    assert poll()[0] == ("S", ["id", "b", "d"])
    src.execute("UPDATE t SET b = 'B' WHERE id = 2")
    assert poll() == [("UPDATE", [2], [2, "B", "d2"])]
    # A new capture (a publisher restart) repeats the schema before its first row.
    cap2 = SqliteCapture(tmp_path / "src.db")
    cap2.install("p", "i", ["t"])
    src.execute("DELETE FROM t WHERE id = 1")
    entry, _ = cap2.build_entry("p", cap2.read(pos), pos, cap2.installed()["p"])
    assert _ops(entry) == [("S", ["id", "b", "d"]), ("DELETE", [1], [])]


def test_rebuilt_table_is_truncated_and_copied(tmp_path: Path) -> None:
    """Create new, copy, drop old, rename: the triggers went with the old table, so the
    capture logs the schema, a truncate and every row, changes since included."""
    src = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT)")
    src.execute("INSERT INTO t VALUES (1, 'a1')")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "i", ["t"])
    rows = cap.read(0)
    _, pos = cap.build_entry("p", rows, 0, cap.installed()["p"])
    src.executescript(
        "BEGIN; CREATE TABLE t2(id INTEGER PRIMARY KEY, a INTEGER); INSERT INTO t2 SELECT * FROM t;"
        " DROP TABLE t; ALTER TABLE t2 RENAME TO t; COMMIT;"
    )
    src.execute("INSERT INTO t VALUES (2, 5)")  # no trigger: the copy carries it
    entry, _ = cap.build_entry("p", cap.read(pos), pos, cap.installed()["p"])
    assert _ops(entry) == [
        ("S", ["id", "a"]),
        ("TRUNCATE", [], []),
        ("INSERT", [], [1, "a1"]),
        ("INSERT", [], [2, 5]),
    ]
    assert entry is not None
    assert entry.ops[0].schema.columns[1].type == pb.COLUMN_TYPE_INTEGER
