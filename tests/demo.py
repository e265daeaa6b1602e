"""``make demo``: SQLite source → publisher → subscriber (local Spark) → SQLite target.

1. creates a SQLite source with the W1 shop schema (accounts, orders);
2. starts the publisher as a real process;
3. writes transactions while no subscriber runs (a backlog);
4. starts the subscriber: it catches up (syncing → in sync);
5. keeps writing while it runs (live);
6. compares source and target row by row: prints ``equal`` or the differences
   and exits non-zero if they differ.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import threading
import time
from pathlib import Path

from tests.harness import ROOT, Pair, wait_until
from tests.workload import W1, W1_COLUMNS, diff_tables, run_sqlite, sqlite_source, w1_checksum


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=ROOT / "demo-data")
    ap.add_argument("--accounts", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=3000, help="transactions before the subscriber")
    ap.add_argument("--live", type=int, default=2000, help="transactions while it runs")
    args = ap.parse_args(argv)

    if args.dir.exists():
        shutil.rmtree(args.dir)
    args.dir.mkdir(parents=True)
    pair = Pair(args.dir, tables=["accounts", "orders"])
    w1 = W1(accounts=args.accounts)
    src = sqlite_source(pair.source_path)
    run_sqlite(src, w1.transactions(1))  # transaction 0: the accounts
    say(f"source {pair.source_path}: {args.accounts} accounts")
    try:
        pub = pair.start_publisher()
        say(f"publisher pub1 listening on {pub.address} (log: {args.dir / 'publisher.log'})")

        t0 = time.monotonic()
        run_sqlite(src, w1.transactions(args.backlog))
        say(
            f"wrote {args.backlog} transactions with no subscriber running "
            f"({args.backlog / (time.monotonic() - t0):.0f} txn/s)"
        )
        wait_until(lambda: pair.head() > 0, 30, "the publisher to capture")
        say(f"publication 'shop' head: {pair.head()} entries")

        sub = pair.start_subscriber()
        say(f"subscriber sub1 started (control {sub.address}; log {args.dir / 'subscriber.log'})")
        seen: list[str] = []

        def watch() -> None:
            while sub.running and len(seen) < 1000:
                try:
                    st = pair.status()
                except Exception:
                    time.sleep(0.1)
                    continue
                if not seen or seen[-1] != st.state:
                    seen.append(st.state)
                    say(f"subscriber state: {st.state:<12} level {st.level} / head {st.head}")
                if st.state == "in_sync":
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t1 = time.monotonic()
        pair.wait_caught_up(timeout=300)
        watcher.join(5)
        say(f"caught up in {time.monotonic() - t1:.1f}s (includes Spark start-up)")

        say(f"writing {args.live} transactions live …")
        t2 = time.monotonic()
        run_sqlite(src, w1.transactions(args.live))
        say(f"… done ({args.live / (time.monotonic() - t2):.0f} txn/s)")

        dst = sqlite3.connect(str(pair.target_path), timeout=30)

        def equal() -> bool:
            try:
                return w1_checksum(src) == w1_checksum(dst)
            except sqlite3.Error:
                return False

        try:
            wait_until(equal, 120, "the target to equal the source", interval=0.2)
        except TimeoutError:
            pass
        st = pair.status()
        say(f"subscriber: state {st.state}, level {st.level}, head {st.head}")
        problems = diff_tables(src, dst, W1_COLUMNS)
        if problems:
            print("DIFFERENT:")
            for p in problems:
                print("  " + p)
            return 1
        counts = {t: src.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in W1_COLUMNS}
        say(f"source and target compared row by row: {counts}, checksum {w1_checksum(dst)}")
        print("equal")
        return 0
    finally:
        pair.stop()


if __name__ == "__main__":
    sys.exit(main())
