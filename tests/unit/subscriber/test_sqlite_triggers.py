"""The replica role of SQLite targets: the guard the writer adds to the target's triggers."""

from __future__ import annotations

import sqlite3

from subscriber.targets.sqlite.triggers import TriggerGuard, guarded


def test_guard_is_added_before_begin_or_anded_with_the_own_when_clause() -> None:
    """Quotes and comments are not read as keywords; an existing WHEN keeps its meaning."""
    plain = "CREATE TRIGGER a AFTER INSERT ON t BEGIN INSERT INTO x VALUES (1); END"
    assert guarded(plain) == (
        "CREATE TRIGGER a AFTER INSERT ON t WHEN NOT EXISTS (SELECT 1 FROM txrepl_applying) "
        "BEGIN INSERT INTO x VALUES (1); END"
    )
    tricky = (
        'CREATE TRIGGER "when begin" AFTER UPDATE OF "begin" ON t /* BEGIN */ '
        "WHEN NEW.x = 'BEGIN' OR NEW.y > 1 BEGIN SELECT CASE WHEN 1 THEN 2 END; END"
    )
    assert guarded(tricky) == (
        'CREATE TRIGGER "when begin" AFTER UPDATE OF "begin" ON t /* BEGIN */ '
        "WHEN NOT EXISTS (SELECT 1 FROM txrepl_applying) AND (NEW.x = 'BEGIN' OR NEW.y > 1) "
        "BEGIN SELECT CASE WHEN 1 THEN 2 END; END"
    )
    assert guarded(guarded(plain) or "") is None  # once only
    assert guarded(plain.replace("BEGIN", "BEGIN /* txrepl:always */")) is None


def test_guarded_triggers_fire_for_others_and_not_inside_the_apply() -> None:
    """Another connection's writes fire the guarded trigger; with the marker row, not."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(
        "CREATE TABLE txrepl_applying(since TEXT NOT NULL); CREATE TABLE t(id INTEGER);"
        " CREATE TABLE audit(id INTEGER);"
        " CREATE TRIGGER a AFTER INSERT ON t WHEN NEW.id > 0 BEGIN"
        " INSERT INTO audit VALUES (NEW.id); END;"
    )
    guard = TriggerGuard()
    assert guard.ensure(conn) == ["a"]
    assert guard.ensure(conn) == []  # nothing changed since
    conn.execute("INSERT INTO t VALUES (1)")
    conn.execute("INSERT INTO t VALUES (-1)")  # its own WHEN still holds
    conn.execute("BEGIN")
    conn.execute("INSERT INTO txrepl_applying VALUES ('now')")
    conn.execute("INSERT INTO t VALUES (2)")
    conn.execute("DELETE FROM txrepl_applying")
    conn.execute("COMMIT")
    assert conn.execute("SELECT id FROM audit").fetchall() == [(1,)]
