"""``make demo``: SQLite source → publisher → subscriber (local Spark) → SQLite target.

1. creates a SQLite source with a small shop schema (accounts, orders);
2. starts the publisher as a real process (``python -m publisher run``);
3. writes transactions while no subscriber runs (a backlog);
4. starts the subscriber: it catches up (syncing → in sync);
5. keeps writing while it runs (live);
6. compares source and target row by row: prints ``equal`` or the differences
   and exits non-zero if they differ.

Everything lands in ``demo-data/`` (configs, databases, daemon logs), so the
daemons can be started again by hand afterwards.  This script is a user of txrepl,
not part of it: it talks to the daemons only through their command line and the
gRPC stubs in ``common.rpc``, and imports nothing from ``tests/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import hashlib
import os
import random
import shutil
import signal
import sqlite3
import string
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import client_channel

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]

SCHEMA = """
CREATE TABLE accounts(
    id INTEGER PRIMARY KEY, owner TEXT NOT NULL, balance INTEGER NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL);
CREATE TABLE orders(
    id INTEGER PRIMARY KEY, account_id INTEGER NOT NULL, amount DECIMAL(12,2) NOT NULL,
    status TEXT NOT NULL, note TEXT);
"""

# Compared columns (updated_at is a timestamp whose text form may differ).
COLUMNS = {
    "accounts": ("id", "owner", "balance"),
    "orders": ("id", "account_id", "amount", "status", "note"),
}

PUBLISHER_TOML = """\
server_name = "pub1"
listen = "127.0.0.1:0"
data_dir = "{dir}/publisher"
source = "sqlite:///{dir}/source.db"
poll_interval_ms = 2

[[publication]]
name = "shop"
tables = ["accounts", "orders"]
"""

SUBSCRIBER_TOML = """\
server_name = "sub1"
target = "sqlite:///{dir}/target.db"
control_listen = "127.0.0.1:0"
data_dir = "{dir}/subscriber"

[backoff]
initial_s = 0.1
max_s = 1.0

[[subscription]]
publisher = "pub1"
address = "{address}"
publication = "shop"
"""


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_until(cond: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


class Shop:
    """A seeded stream of shop transactions: orders placed, shipped, deleted."""

    def __init__(self, accounts: int, seed: int = 42) -> None:
        self.rng = random.Random(seed)
        self.accounts = accounts
        self.balances = dict.fromkeys(range(1, accounts + 1), 0)
        self.live: list[int] = []
        self.next_order = 1

    def open(self, path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SCHEMA)
        now = dt.datetime.now(dt.UTC).isoformat()
        with_rows = [(a, f"owner-{a}", 0, now) for a in self.balances]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO accounts VALUES (?, ?, ?, ?)", with_rows)
        conn.execute("COMMIT")
        return conn

    def transaction(self, conn: sqlite3.Connection) -> None:
        rng, order = self.rng, self.next_order
        self.next_order += 1
        account = rng.randint(1, self.accounts)
        cents = rng.randint(100, 50000)
        note = "".join(rng.choices(string.ascii_lowercase, k=40))
        self.balances[account] += cents
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO orders VALUES (?, ?, ?, 'new', ?)",
            (order, account, str(decimal.Decimal(cents).scaleb(-2)), note),
        )
        conn.execute(
            "UPDATE accounts SET balance = ?, updated_at = ? WHERE id = ?",
            (self.balances[account], dt.datetime.now(dt.UTC).isoformat(), account),
        )
        if self.live and rng.random() < 0.2:
            pick = self.live[rng.randrange(len(self.live))]
            conn.execute("UPDATE orders SET status = 'shipped' WHERE id = ?", (pick,))
        if self.live and rng.random() < 0.05:
            idx = rng.randrange(len(self.live))
            pick = self.live[idx]
            self.live[idx] = self.live[-1]
            self.live.pop()
            conn.execute("DELETE FROM orders WHERE id = ?", (pick,))
        conn.execute("COMMIT")
        self.live.append(order)

    def run(self, conn: sqlite3.Connection, count: int) -> float:
        """Commit ``count`` transactions; returns transactions per second."""
        t0 = time.monotonic()
        for _ in range(count):
            self.transaction(conn)
        return count / max(time.monotonic() - t0, 1e-9)


def rows(conn: sqlite3.Connection, table: str) -> Iterator[str]:
    cols = COLUMNS[table]
    for row in conn.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY id"):
        yield "|".join(
            f"{decimal.Decimal(str(v)):.2f}" if c == "amount" else ("" if v is None else str(v))
            for c, v in zip(cols, row, strict=True)
        )


def checksum(conn: sqlite3.Connection) -> str:
    h = hashlib.md5()
    for table in COLUMNS:
        h.update("\n".join(rows(conn, table)).encode() + b"\n--\n")
    return h.hexdigest()


def differences(src: sqlite3.Connection, dst: sqlite3.Connection, limit: int = 10) -> list[str]:
    problems: list[str] = []
    for table in COLUMNS:
        a = list(rows(src, table))
        try:
            b = list(rows(dst, table))
        except sqlite3.Error as e:
            problems.append(f"{table}: cannot read target ({e})")
            continue
        if len(a) != len(b):
            problems.append(f"{table}: source has {len(a)} rows, target {len(b)}")
        problems += [f"{table}: only on source: {r}" for r in sorted(set(a) - set(b))[:limit]]
        problems += [f"{table}: only on target: {r}" for r in sorted(set(b) - set(a))[:limit]]
    return problems


class Daemon:
    """``python -m KIND run --config FILE`` as a process; ready once it wrote its address."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind, self.workdir = kind, workdir
        self.addr_file = workdir / kind / f"{kind}.addr"
        self.log_path = workdir / f"{kind}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self, timeout: float = 90.0) -> Daemon:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.setdefault("TXREPL_METRICS_LISTEN", "127.0.0.1:0")  # the default port may be taken
        config = self.workdir / f"{self.kind}.toml"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.kind, "run", "--config", str(config)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited during start-up; see {self.log_path}")
            return self.addr_file.exists() and bool(self.addr_file.read_text().strip())

        wait_until(ready, timeout, f"the {self.kind} to be ready")
        self.address = self.addr_file.read_text().strip()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM (a graceful drain), SIGKILL if it takes more than a minute."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def head(pub: Daemon) -> int:
    with client_channel(pub.address, None) as ch:
        resp = rpc.AdminStub(ch).ListPublications(pb.ListPublicationsRequest(), timeout=10)
    return next((int(p.head) for p in resp.publications if p.name == "shop"), 0)


def status(sub: Daemon) -> pb.SubscriptionStatus:
    with client_channel(sub.address, None) as ch:
        resp = rpc.SubscriberControlStub(ch).Status(pb.StatusRequest(), timeout=10)
    (st,) = resp.subscriptions
    return st


def catch_up(pub: Daemon, sub: Daemon, timeout: float) -> None:
    """Print each state the subscriber passes through until it is in sync at the head."""
    last = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            st, h = status(sub), head(pub)
        except grpc.RpcError:
            time.sleep(0.1)
            continue
        if st.state != last:
            last = st.state
            say(f"subscriber state: {st.state:<12} level {st.level} / head {st.head}")
        if st.state == "in_sync" and st.level == h:
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout}s waiting for the subscriber to catch up")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dir", type=Path, default=ROOT / "demo-data")
    ap.add_argument("--accounts", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=3000, help="transactions before the subscriber")
    ap.add_argument("--live", type=int, default=2000, help="transactions while it runs")
    args = ap.parse_args(argv)

    workdir: Path = args.dir.resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    shop = Shop(args.accounts)
    src = shop.open(workdir / "source.db")
    say(f"source {workdir / 'source.db'}: {args.accounts} accounts")
    (workdir / "publisher.toml").write_text(PUBLISHER_TOML.format(dir=workdir))
    pub, sub = Daemon("publisher", workdir), Daemon("subscriber", workdir)
    try:
        pub.start()
        say(f"publisher pub1 listening on {pub.address} (log: {pub.log_path})")
        rate = shop.run(src, args.backlog)
        say(f"wrote {args.backlog} transactions with no subscriber running ({rate:.0f} txn/s)")
        wait_until(lambda: head(pub) > 0, 30, "the publisher to capture")
        say(f"publication 'shop' head: {head(pub)} entries")

        config = SUBSCRIBER_TOML.format(dir=workdir, address=pub.address)
        (workdir / "subscriber.toml").write_text(config)
        sub.start()
        say(f"subscriber sub1 started (control {sub.address}; log {sub.log_path})")
        t1 = time.monotonic()
        catch_up(pub, sub, timeout=300)
        say(f"caught up in {time.monotonic() - t1:.1f}s (includes Spark start-up)")

        say(f"writing {args.live} transactions live …")
        say(f"… done ({shop.run(src, args.live):.0f} txn/s)")

        dst = sqlite3.connect(str(workdir / "target.db"), timeout=30)
        try:
            return compare(src, dst, sub)
        finally:
            dst.close()
    finally:
        sub.stop()
        pub.stop()
        src.close()


def compare(src: sqlite3.Connection, dst: sqlite3.Connection, sub: Daemon) -> int:
    """Wait for the target to equal the source, then compare row by row; 0 if equal."""

    def equal() -> bool:
        try:
            return checksum(src) == checksum(dst)
        except sqlite3.Error:
            return False

    try:
        wait_until(equal, 120, "the target to equal the source", interval=0.2)
    except TimeoutError:
        pass
    st = status(sub)
    say(f"subscriber: state {st.state}, level {st.level}, head {st.head}")
    problems = differences(src, dst)
    if problems:
        print("DIFFERENT:")
        for p in problems:
            print("  " + p)
        return 1
    counts = {t: src.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COLUMNS}
    say(f"source and target compared row by row: {counts}, checksum {checksum(dst)}")
    print("equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
