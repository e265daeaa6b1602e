"""A W1-style stream with a ledger, for fault tests: what went in must come out once.

Every source transaction is a W1 transaction (orders and accounts) plus one row in
``ledger`` (id = the transaction number) and ``counter.n += 1``.  On the target, two
triggers count how many times each ledger row was written by the subscriber
(``apply_count``): a lost transaction leaves a ledger row missing, a transaction
applied twice leaves ``apply_count.n = 2``, and the W1 checksum catches any other
difference.  The target tables are created before the subscriber's first start with
the declarations its SQLite writer would use, so the triggers see every write.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from tests.support.workload import W1, W1_COLUMNS, diff_tables, sqlite_source, w1_checksum

__all__ = ["TABLES", "StreamWriter", "prepare_target", "verify"]

TABLES = ["accounts", "orders", "counter", "ledger"]
LEDGER_COLUMNS = {"counter": ("id", "n"), "ledger": ("id", "txn", "note")}

_SOURCE_EXTRA = """
CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ledger(id INTEGER PRIMARY KEY, txn INTEGER NOT NULL, note TEXT);
"""

_TARGET = """
CREATE TABLE IF NOT EXISTS ledger("id" INTEGER, "txn" INTEGER NOT NULL, "note" TEXT,
                                  PRIMARY KEY ("id"));
CREATE TABLE IF NOT EXISTS apply_count(id INTEGER PRIMARY KEY, n INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS ledger_ai AFTER INSERT ON ledger BEGIN
    /* txrepl:always: counts the replicated applies */
    INSERT OR IGNORE INTO apply_count VALUES (NEW.id, 0);
    UPDATE apply_count SET n = n + 1 WHERE id = NEW.id;
END;
CREATE TRIGGER IF NOT EXISTS ledger_au AFTER UPDATE ON ledger BEGIN
    /* txrepl:always: counts the replicated applies */
    INSERT OR IGNORE INTO apply_count VALUES (NEW.id, 0);
    UPDATE apply_count SET n = n + 1 WHERE id = NEW.id;
END;
"""


def open_source(path: Path) -> sqlite3.Connection:
    sqlite_source(path).close()  # the W1 schema, in WAL mode
    # Created here, used by the writer thread.
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=30, check_same_thread=False)
    conn.executescript(_SOURCE_EXTRA)
    conn.execute("INSERT OR IGNORE INTO counter VALUES (1, 0)")
    return conn


def prepare_target(path: Path) -> None:
    """Create the target's ledger and the apply-counting triggers before the first sync."""
    conn = sqlite3.connect(str(path))
    conn.executescript(_TARGET)
    conn.close()


class StreamWriter(threading.Thread):
    """Writes the stream on the source at ``rate`` txn/s until stopped (or ``limit``)."""

    def __init__(self, source: Path, rate: float, accounts: int = 200, limit: int = 0) -> None:
        super().__init__(name="chaos-writer", daemon=True)
        self.conn = open_source(source)
        self.rate = rate
        self.limit = limit
        self.w1 = W1(accounts=accounts)
        self.committed = 0  # ledger rows committed (transactions after W1's transaction 0)
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self._txn(self.w1.transaction(), ledger=False)  # W1 transaction 0: the accounts

    def _txn(self, stmts: list[tuple[str, tuple[object, ...]]], ledger: bool = True) -> None:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        for sql, params in stmts:
            c.execute(
                sql.replace("{p}", "?"),
                tuple(str(v) if not isinstance(v, int | str) else v for v in params),
            )
        if ledger:
            t = self.committed + 1
            c.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
            c.execute("INSERT INTO ledger VALUES (?, ?, ?)", (t, t, f"txn {t}"))
        c.execute("COMMIT")
        if ledger:
            self.committed += 1

    def run(self) -> None:
        started = time.monotonic()
        n = 0
        try:
            while not self.halt.is_set() and (not self.limit or n < self.limit):
                delay = started + n / self.rate - time.monotonic()
                if delay > 0:
                    self.halt.wait(delay)
                self._txn(self.w1.transaction())
                n += 1
        except BaseException as e:  # the test must see it
            self.error = e

    def check(self) -> None:
        """Raise the writer's error, if it died."""
        if self.error is not None:
            raise self.error

    def stop(self) -> int:
        self.halt.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return self.committed


def wait_converged(source: Path, target: Path, timeout: float) -> None:
    """Wait until the target's ledger and W1 tables equal the source's."""
    src = sqlite3.connect(str(source), timeout=30)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                dst = sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=30)
                try:
                    if not diff_tables(src, dst, {**W1_COLUMNS, **LEDGER_COLUMNS}, limit=1):
                        return
                finally:
                    dst.close()
            except sqlite3.Error:
                pass
            if time.monotonic() > deadline:
                dst = sqlite3.connect(str(target), timeout=30)
                problems = diff_tables(src, dst, {**W1_COLUMNS, **LEDGER_COLUMNS})
                raise AssertionError("target differs from source:\n" + "\n".join(problems))
            time.sleep(0.25)
    finally:
        src.close()


def verify(source: Path, target: Path, committed: int, timeout: float = 180.0) -> str:
    """Target = source, every ledger row present and applied once; returns a summary line."""
    wait_converged(source, target, timeout)
    src = sqlite3.connect(str(source), timeout=30)
    dst = sqlite3.connect(str(target), timeout=30)
    try:
        assert w1_checksum(src) == w1_checksum(dst), "W1 checksum differs"
        (n,) = dst.execute("SELECT n FROM counter WHERE id = 1").fetchone()
        (rows,) = dst.execute("SELECT count(*) FROM ledger").fetchone()
        (lo, hi) = dst.execute("SELECT min(id), max(id) FROM ledger").fetchone()
        twice = dst.execute("SELECT id, n FROM apply_count WHERE n != 1 LIMIT 5").fetchall()
        (counted,) = dst.execute("SELECT count(*) FROM apply_count").fetchone()
        assert n == rows == committed, f"counter {n}, ledger rows {rows}, committed {committed}"
        assert (lo, hi) == (1, committed), f"ledger ids {lo}..{hi}, expected 1..{committed}"
        assert counted == committed, f"{counted} ledger rows counted on the target"
        assert not twice, f"ledger rows written more than once: {twice}"
        return (
            f"verified: W1 checksum equal, {committed} transactions, counter = ledger rows = "
            f"{committed}, every ledger row written exactly once"
        )
    finally:
        src.close()
        dst.close()
