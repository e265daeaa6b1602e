"""A small two-table SQLite source (counter, ledger) and waiting for a target to equal it."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from tests.support.harness import wait_until
from tests.support.workload import (
    diff_tables,
)

LEDGER = """
CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ledger(id INTEGER PRIMARY KEY, txn INTEGER NOT NULL,
                                  amount DECIMAL(10,2) NOT NULL, note TEXT);
"""


LEDGER_COLUMNS = {"counter": ("id", "n"), "ledger": ("id", "txn", "amount", "note")}


def ledger_source(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(LEDGER)
    conn.execute("INSERT OR IGNORE INTO counter VALUES (1, 0)")
    return conn


def ledger_txns(conn: sqlite3.Connection, start: int, count: int, seed: int = 7) -> None:
    """Each transaction counts itself in counter.n and leaves one ledger row."""
    rng = random.Random(seed + start)
    for t in range(start, start + count):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
        conn.execute(
            "INSERT INTO ledger(id, txn, amount, note) VALUES (?, ?, ?, ?)",
            (t, t, f"{rng.randint(1, 99999) / 100:.2f}", f"txn {t}"),
        )
        if t % 7 == 0 and t > 10:
            conn.execute("UPDATE ledger SET note = note || ' (touched)' WHERE id = ?", (t - 5,))
        conn.execute("COMMIT")


def wait_equal(src: sqlite3.Connection, target: Path, tables: dict, timeout: float = 120) -> None:
    dst = sqlite3.connect(str(target), timeout=30)

    def same() -> bool:
        try:
            return not diff_tables(src, dst, tables, limit=1)
        except sqlite3.Error:
            return False

    try:
        wait_until(same, timeout, "the target to equal the source", interval=0.2)
    except TimeoutError:
        problems = diff_tables(src, dst, tables)
        raise AssertionError("target differs from source:\n" + "\n".join(problems)) from None
    finally:
        dst.close()
