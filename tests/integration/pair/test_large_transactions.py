"""A source transaction larger than one entry: carried as fragments, applied whole (issue 21).

The publisher's ``max_entry_bytes`` is set to 16 KiB and the subscriber's batches to
4 entries, so one source transaction of a few MB travels as hundreds of entries and
spans many batches.  A watcher reads the target all along: it must only ever see
all or nothing of the transaction, through kill -9 of the publisher while it writes
the fragments and of the subscriber while it receives and applies them.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from common.fragments import mark
from publisher.log import open_log
from tests.support.harness import Pair, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

ROWS = 12_000  # of 600 bytes: about 7 MB, some 450 entries of 16 KiB


def _write_big_transaction(source: Path, first: int) -> None:
    conn = sqlite3.connect(str(source), isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO docs VALUES (?, ?)",
        [(i, f"{i:08d}" + "x" * 600) for i in range(first, first + ROWS)],
    )
    conn.execute("COMMIT")
    conn.close()


class Watcher(threading.Thread):
    """Counts the target's rows as often as it can, recording every count it sees."""

    def __init__(self, count: Callable[[], int | None]) -> None:
        super().__init__(daemon=True)
        self.count = count
        self.seen: set[int] = set()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            n = self.count()
            if n is not None:
                self.seen.add(n)
            time.sleep(0.002)


def _counter(target_kind: str, target: str) -> Callable[[], int | None]:
    def count() -> int | None:
        try:
            if target_kind == "sqlite":
                with sqlite3.connect(target, timeout=1) as conn:
                    return int(conn.execute("SELECT count(*) FROM docs").fetchone()[0])
            with psycopg.connect(target, connect_timeout=5) as pg:
                row = pg.execute("SELECT count(*) FROM docs").fetchone()
                return int(row[0]) if row else None
        except (sqlite3.Error, psycopg.Error):
            return None

    return count


def _aborted_groups(pair: Pair) -> int:
    """Aborted marks in the publication's log (read after the publisher stopped)."""
    log = open_log(pair.workdir / "publisher" / "publications" / pair.publication)
    try:
        seq, found = log.first_seq, 0
        while seq <= log.head:
            batch = log.read(seq, max_entries=10_000)
            found += sum(1 for p in batch if len(p) < 96 and mark(p).aborted)
            seq += len(batch)
        return found
    finally:
        log.close()


@pytest.mark.parametrize(
    "target_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_transaction_over_many_entries_is_all_or_nothing_through_kills(
    tmp_path: Path, request: Any, target_kind: str
) -> None:
    """Fragments of one source transaction: the target shows none or all of it, always."""
    if target_kind == "postgres":
        target = request.getfixturevalue("pg_server").create_database()
        target_url = target
    else:
        target = str(tmp_path / "target.db")
        target_url = ""
    rng = random.Random(21)
    pair = Pair(
        tmp_path,
        tables=["docs"],
        target_url=target_url,
        publisher_extra={"max_entry_bytes": 16 * 1024},
        subscriber_extra={"batch": {"max_entries": 4, "queue_batches": 2}},
    )
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("PRAGMA journal_mode=WAL")
    src.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, body TEXT)")
    src.execute("INSERT INTO docs VALUES (0, 'before')")
    watcher = Watcher(_counter(target_kind, target))
    try:
        pub = pair.start_publisher()
        port = pub.address.rsplit(":", 1)[1]
        pair.start_subscriber()
        before = pair.wait_caught_up()
        watcher.start()

        # 1. kill -9 of the publisher while it writes the transaction's fragments.
        _write_big_transaction(pair.source_path, 1)
        wait_until(lambda: pair.head() >= before + 20, 60, "the first fragments")
        assert pair.pub is not None
        pair.pub.kill()
        pair.start_publisher(listen=f"127.0.0.1:{port}")
        count = _counter(target_kind, target)
        wait_until(lambda: count() == 1 + ROWS, 180, "the transaction applied")

        # 2. kill -9 of the subscriber while it receives or applies the next one.
        head = pair.head()
        _write_big_transaction(pair.source_path, 1 + ROWS)
        wait_until(lambda: pair.head() >= head + 100, 60, "the second transaction's fragments")
        time.sleep(rng.uniform(0.0, 1.0))
        assert pair.sub is not None
        pair.sub.kill()
        pair.start_subscriber()
        pair.wait_caught_up(timeout=300)
        watcher.halt.set()
        watcher.join()
        assert watcher.seen <= {1, 1 + ROWS, 1 + 2 * ROWS}, sorted(watcher.seen)[:10]
        assert count() == 1 + 2 * ROWS
        pair.stop()
        assert _aborted_groups(pair) >= 1  # the publisher's kill did land inside the group
    finally:
        watcher.halt.set()
        pair.stop()
        src.close()
