"""Workload W1 (docs/benchmarks.md, "W1") and source/target comparison helpers.

One ``random.Random(seed)`` drives everything, draws in the order W1 fixes, so
the stream is the same on every machine and every dialect.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import random
import sqlite3
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts(
    id INTEGER PRIMARY KEY, owner TEXT NOT NULL, balance INTEGER NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS orders(
    id INTEGER PRIMARY KEY, account_id INTEGER NOT NULL, amount DECIMAL(12,2) NOT NULL,
    status TEXT NOT NULL, note TEXT);
"""

PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts(
    id BIGINT PRIMARY KEY, owner TEXT NOT NULL, balance BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS orders(
    id BIGINT PRIMARY KEY, account_id BIGINT NOT NULL, amount NUMERIC(12,2) NOT NULL,
    status TEXT NOT NULL, note TEXT);
"""

# (sql with {p} placeholders, params); {p} becomes ? or %s per dialect.
Stmt = tuple[str, tuple[Any, ...]]


@dataclass
class W1:
    """The W1 stream: transaction 0 inserts the accounts, 1..T the orders."""

    seed: int = 42
    accounts: int = 10_000
    rng: random.Random = field(init=False)
    balances: dict[int, int] = field(init=False)
    live: list[int] = field(init=False)
    next_txn: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.balances = {}
        self.live = []

    @staticmethod
    def now() -> str:
        return dt.datetime.now(dt.UTC).isoformat()

    def transaction(self) -> list[Stmt]:
        """The next transaction of the stream, as statements."""
        i = self.next_txn
        self.next_txn += 1
        if i == 0:
            now = self.now()
            self.balances = dict.fromkeys(range(1, self.accounts + 1), 0)
            return [
                (
                    "INSERT INTO accounts(id, owner, balance, updated_at) VALUES ({p},{p},{p},{p})",
                    (a, f"owner-{a}", 0, now),
                )
                for a in range(1, self.accounts + 1)
            ]
        rng = self.rng
        account = rng.randint(1, self.accounts)
        cents = rng.randint(100, 50000)
        amount = decimal.Decimal(cents).scaleb(-2)
        note = "".join(rng.choices(string.ascii_lowercase, k=40))
        self.balances[account] += cents
        stmts: list[Stmt] = [
            (
                "INSERT INTO orders(id, account_id, amount, status, note) "
                "VALUES ({p},{p},{p},{p},{p})",
                (i, account, amount, "new", note),
            ),
            (
                "UPDATE accounts SET balance = {p}, updated_at = {p} WHERE id = {p}",
                (self.balances[account], self.now(), account),
            ),
        ]
        if rng.random() < 0.2 and self.live:
            pick = self.live[rng.randrange(len(self.live))]
            stmts.append(("UPDATE orders SET status = 'shipped' WHERE id = {p}", (pick,)))
        if rng.random() < 0.05 and self.live:
            idx = rng.randrange(len(self.live))
            pick = self.live[idx]
            self.live[idx] = self.live[-1]
            self.live.pop()
            stmts.append(("DELETE FROM orders WHERE id = {p}", (pick,)))
        self.live.append(i)
        return stmts

    def transactions(self, count: int) -> Iterator[list[Stmt]]:
        for _ in range(count):
            yield self.transaction()


def _sqlite_param(v: Any) -> Any:
    return str(v) if isinstance(v, decimal.Decimal) else v


def sqlite_source(path: Path) -> sqlite3.Connection:
    """Open (creating) a W1 SQLite source in WAL mode, autocommit off."""
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SQLITE_SCHEMA)
    return conn


def run_sqlite(conn: sqlite3.Connection, txns: Iterator[list[Stmt]] | Sequence[list[Stmt]]) -> int:
    """Run each transaction as one SQLite transaction; returns the count."""
    n = 0
    for stmts in txns:
        conn.execute("BEGIN IMMEDIATE")
        for sql, params in stmts:
            conn.execute(sql.replace("{p}", "?"), tuple(_sqlite_param(v) for v in params))
        conn.execute("COMMIT")
        n += 1
    return n


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, decimal.Decimal):
        return f"{v:.2f}"
    if isinstance(v, float):
        return f"{decimal.Decimal(repr(v)):.2f}"
    return str(v)


def content_rows(conn: Any, table: str, columns: Sequence[str]) -> list[str]:
    """Rows of ``table`` ordered by id, columns joined by '|' (amounts with two decimals)."""
    cur = conn.cursor()
    cur.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY id")
    out = []
    for row in cur.fetchall():
        vals = []
        for c, v in zip(columns, row, strict=True):
            if c == "amount" and v is not None:
                v = decimal.Decimal(str(v))
            vals.append(_fmt(v))
        out.append("|".join(vals))
    return out


W1_COLUMNS = {
    "accounts": ("id", "owner", "balance"),
    "orders": ("id", "account_id", "amount", "status", "note"),
}


def w1_checksum(conn: Any) -> str:
    """W1's content md5 (updated_at excluded) over accounts then orders."""
    h = hashlib.md5()
    for table, cols in W1_COLUMNS.items():
        h.update("\n".join(content_rows(conn, table, cols)).encode())
        h.update(b"\n--\n")
    return h.hexdigest()


def diff_tables(
    src: Any, dst: Any, tables: Mapping[str, Sequence[str]], limit: int = 10
) -> list[str]:
    """Human-readable differences between two databases, at most ``limit`` lines."""
    problems: list[str] = []
    for table, cols in tables.items():
        a = content_rows(src, table, cols)
        try:
            b = content_rows(dst, table, cols)
        except Exception as e:  # the table may be missing on the target
            problems.append(f"{table}: cannot read target ({e})")
            continue
        if len(a) != len(b):
            problems.append(f"{table}: source has {len(a)} rows, target {len(b)}")
        sa_, sb = set(a), set(b)
        for row in sorted(sa_ - sb)[:limit]:
            problems.append(f"{table}: only on source: {row}")
        for row in sorted(sb - sa_)[:limit]:
            problems.append(f"{table}: only on target: {row}")
    return problems[: limit * 4]


def pg_source(dsn: str) -> Any:
    """Connect (autocommit) to a PostgreSQL database and create the W1 schema."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(PG_SCHEMA)
    return conn


def run_pg(conn: Any, txns: Iterator[list[Stmt]] | Sequence[list[Stmt]]) -> int:
    """Run each transaction as one PostgreSQL transaction; returns the count."""
    n = 0
    for stmts in txns:
        with conn.transaction():
            for sql, params in stmts:
                conn.execute(sql.replace("{p}", "%s"), params)
        n += 1
    return n


MARIA_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS accounts(id BIGINT PRIMARY KEY, owner TEXT NOT NULL,"
    " balance BIGINT NOT NULL, updated_at TIMESTAMP(6) NOT NULL)",
    "CREATE TABLE IF NOT EXISTS orders(id BIGINT PRIMARY KEY, account_id BIGINT NOT NULL,"
    " amount DECIMAL(12,2) NOT NULL, status TEXT NOT NULL, note TEXT)",
]


def maria_source(url: str) -> Any:
    """Connect (transactions, UTC) to a MariaDB database and create the W1 schema."""
    import pymysql

    from common.dburl import mariadb_params

    conn = pymysql.connect(
        **mariadb_params(url), autocommit=False, init_command="SET time_zone = '+00:00'"
    )
    with conn.cursor() as cur:
        for statement in MARIA_SCHEMA:
            cur.execute(statement)
    conn.commit()
    return conn


def maria_commit(url: str, *statements: str) -> None:
    """Run ``statements`` in ONE MariaDB transaction (DDL commits on its own there)."""
    import pymysql

    from common.dburl import mariadb_params

    conn = pymysql.connect(**mariadb_params(url), autocommit=False)
    try:
        cur = conn.cursor()
        for s in statements:
            cur.execute(s)
        conn.commit()
    finally:
        conn.close()


def maria_param(v: Any) -> Any:
    """W1's timestamps are ISO texts with an offset, which MariaDB does not parse."""
    if isinstance(v, str) and v.endswith("+00:00"):
        return dt.datetime.fromisoformat(v).replace(tzinfo=None)
    return v


def run_maria(conn: Any, txns: Iterator[list[Stmt]] | Sequence[list[Stmt]]) -> int:
    """Run each transaction as one MariaDB transaction; returns the count."""
    n = 0
    for stmts in txns:
        with conn.cursor() as cur:
            for sql, params in stmts:
                cur.execute(sql.replace("{p}", "%s"), tuple(maria_param(v) for v in params))
        conn.commit()
        n += 1
    return n
