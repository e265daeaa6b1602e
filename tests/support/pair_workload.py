"""The seeded random workload of the conflict pair tests (issue 24), on SQLite or
PostgreSQL nodes alike.

Each transaction takes the table's write lock before reading its time (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: ``LOCK TABLE ... IN ACCESS EXCLUSIVE MODE``), so its
``ts`` is later than every row it may overwrite, the apply's included: a time read
before waiting on the apply's write would let an older write overwrite a newer row,
which no resolver can undo.  On PostgreSQL the lock must also exclude the apply's
conflict check, which reads the local row without a row lock (a plain ``SELECT``, its
ACCESS SHARE held to the batch's commit): a weaker lock (SHARE ROW EXCLUSIVE, which
waits only for the apply's writes) lets a local write commit between the check and the
apply's write, and the apply then overwrites a row later than the one it judged.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

SHARED = range(1, 21)  # inserted by both nodes (insert_exists), never deleted
TABLE_SQLITE = "CREATE TABLE items (id INTEGER PRIMARY KEY, v TEXT, ts INTEGER, node TEXT)"
TABLE_PG = "CREATE TABLE items (id integer PRIMARY KEY, v text, ts bigint, node text)"


class Keys:
    """Fresh keys for single inserts, handed out once across both writers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next = 1000

    def fresh(self) -> int:
        with self.lock:
            self.next += 1
            return self.next


class Writer:
    """One node's application connection: ``locked(fn)`` runs ``fn(exec, now)`` in a
    transaction holding the table's write lock, ``now`` read after taking it."""

    def __init__(self, url: str) -> None:
        self.pg = not url.startswith("sqlite:///")
        self.conn: Any
        if self.pg:
            self.conn = psycopg.connect(url, autocommit=True)
        else:
            self.conn = sqlite3.connect(
                url.removeprefix("sqlite:///"), timeout=30, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip

    def locked(self, fn: Callable[[Callable[..., Any], int], int]) -> int:
        if self.pg:
            with self.conn.transaction():
                self.conn.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
                return fn(self._pg_exec, time.time_ns() // 1000)
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            made = fn(self.conn.execute, time.time_ns() // 1000)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return made

    def now(self, stmt: str) -> None:
        """``stmt`` (one ``?``, the time) with its ``ts`` read under the lock."""
        self.locked(lambda ex, now: ex(stmt, (now,)).rowcount)

    def _pg_exec(self, stmt: str, params: tuple[Any, ...] = ()) -> Any:
        return self.conn.execute(stmt.replace("?", "%s").encode(), params)

    def close(self) -> None:
        self.conn.close()


def workload(w: Writer, name: str, seed: int, keys: Keys, n: int) -> int:
    """``n`` transactions of one statement each on ``items``; returns the row changes
    made.  Mostly updates of the shared keys (the conflicts), inserts of the shared
    keys on both nodes, fresh inserts, deletes of unshared keys (never re-inserted)."""
    rnd = random.Random(seed)
    shared = list(SHARED)
    rnd.shuffle(shared)

    def one(ex: Callable[..., Any], now: int) -> int:
        ids = [r[0] for r in ex("SELECT id FROM items").fetchall()]
        roll = rnd.random()
        if shared and (roll < 0.15 or not ids):
            k = shared.pop()
            cur = ex(  # the other node's insert may be here already
                "INSERT INTO items VALUES (?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
                "SET v = excluded.v, ts = excluded.ts, node = excluded.node",
                (k, f"{name}-ins", now, name),
            )
        elif roll < 0.3 or not ids:
            cur = ex(
                "INSERT INTO items VALUES (?, ?, ?, ?)", (keys.fresh(), f"{name}-ins", now, name)
            )
        elif roll < 0.4 and [i for i in ids if i not in SHARED]:
            victim = rnd.choice(sorted(i for i in ids if i not in SHARED))
            cur = ex("DELETE FROM items WHERE id = ?", (victim,))
        else:
            pool = sorted(i for i in ids if i in SHARED) or sorted(ids)
            cur = ex(
                "UPDATE items SET v = ?, ts = ?, node = ? WHERE id = ?",
                (f"{name}-{rnd.randrange(1000)}", now, name, rnd.choice(pool)),
            )
        return int(cur.rowcount)

    made = 0
    for _ in range(n):
        made += w.locked(one)
        time.sleep(rnd.random() * 0.01)
    return made


def concurrently(*jobs: Callable[[], Any]) -> list[Any]:
    out: list[Any] = [None] * len(jobs)
    threads = [
        threading.Thread(target=lambda n=n: out.__setitem__(n, jobs[n]())) for n in range(len(jobs))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
