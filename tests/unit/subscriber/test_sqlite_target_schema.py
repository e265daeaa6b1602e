"""The SQLite writer follows the source's columns: dropped (and renamed) ones go."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import WriterError
from subscriber.apply.writer import SchemaStep
from subscriber.targets.sqlite import SqliteWriter


def _schema(*names: str) -> pb.TableSchema:
    s = pb.TableSchema(table="t", primary_key=["id"])
    for n in names:
        s.columns.add(name=n, type=pb.COLUMN_TYPE_TEXT, nullable=n != "id")
    return s


def _columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[1] for r in conn.execute("PRAGMA table_info(t)")]


def _created(path: Path, target_sql: str) -> tuple[SqliteWriter, pb.TableSchema]:
    """A writer that created t(id, a, c) at level 1; then ``target_sql`` on the target."""
    w = SqliteWriter(path)
    v1 = _schema("id", "a", "c")
    w.write("s", "inc", 1, 1, [SchemaStep(v1, None)])
    with sqlite3.connect(path) as conn:
        conn.execute(target_sql)
    return w, v1


def test_dropped_and_renamed_columns_leave_the_target(tmp_path: Path) -> None:
    """a renamed to b, c dropped; a column only the target has stays."""
    path = tmp_path / "t.db"
    w, v1 = _created(path, "ALTER TABLE t ADD COLUMN mine TEXT")
    w.write("s", "inc", 2, 2, [SchemaStep(_schema("id", "b"), v1)])
    assert _columns(path) == ["id", "mine", "b"]
    w.close()


def test_a_column_the_target_cannot_drop_is_named(tmp_path: Path) -> None:
    """An index of the target's own on the dropped column: the batch fails by name and
    changes nothing."""
    path = tmp_path / "t.db"
    w, v1 = _created(path, "CREATE INDEX t_c ON t(c)")
    with pytest.raises(WriterError, match=r"dropped column 'c' of table 't'.*index"):
        w.write("s", "inc", 2, 2, [SchemaStep(_schema("id", "a"), v1)])
    assert _columns(path) == ["id", "a", "c"]
    assert w.load_state("s").level == 1
    w.close()
