"""A publisher restarted on a large SQLite backlog stays within a memory bound (issue 21).

The backlog (40 MB of 100 KB values, written while the publisher is down) is
forty times ``max_entry_bytes``; capture reads it in chunks of about
``max_entry_bytes`` and logs it as a group of entries of at most that size
(publisher/capture/sqlite/source.py ``step``), so the publisher's anonymous
memory while it captures it all stays within what an idle publisher holds plus
a few entries' worth.  A build that read the backlog whole, into one entry,
holds the backlog several times over (its rows, the entry, the serialized
entry: over 100 MB here) and fails the bound.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from common.rpc import txrepl_pb2 as pb
from publisher.log import open_log
from tests.support.harness import Pair, wait_until
from tests.support.rss import start_sampled

MAX_ENTRY_BYTES = 1 << 20
VALUE_BYTES = 100_000
ROWS = 400  # 40 MB of values
# What capture may hold beyond an idle publisher, from configuration only: a chunk of
# captured rows, the entry being built and the one kept back (groups.py), each about
# max_entry_bytes as Python objects and serialized, plus allocator slack.
ALLOWANCE_KIB = 16 * MAX_ENTRY_BYTES // 1024


def _logged_ids(pair: Pair) -> list[int]:
    """The ids of the docs rows in the publication's log, in log order."""
    log = open_log(pair.workdir / "publisher" / "publications" / pair.publication)
    ids: list[int] = []
    try:
        seq = log.first_seq
        while seq <= log.head:
            batch = log.read(seq, max_entries=4)
            for payload in batch:
                for op in pb.Entry.FromString(payload).ops:
                    if op.WhichOneof("kind") == "row" and op.row.table == "docs":
                        ids.append(op.row.row[0].int)
            seq += len(batch)
    finally:
        log.close()
    return ids


def test_a_publisher_restarted_on_a_large_backlog_stays_within_its_bound(tmp_path: Path) -> None:
    pair = Pair(tmp_path, tables=["docs"], publisher_extra={"max_entry_bytes": MAX_ENTRY_BYTES})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("PRAGMA journal_mode=WAL")
    src.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, body TEXT)")
    try:
        # 1. The publisher installs capture on the empty table: its idle footprint.
        pair.pub = pair.publisher_daemon()
        idle = start_sampled(pair.pub, every=0.05)
        ready_at = len(idle.samples)
        wait_until(lambda: len(idle.samples) >= ready_at + 20, 30, "a second of idle samples")
        idle.stop()
        pair.pub.stop()
        idle_kib = max(s[3] for s in idle.samples)

        # 2. The application writes 40 MB while the publisher is down.
        for i in range(1, ROWS + 1):
            src.execute("INSERT INTO docs VALUES (?, ?)", (i, os.urandom(VALUE_BYTES // 2).hex()))
        captured = src.execute("SELECT count(*) FROM _txrepl_capture").fetchone()[0]
        assert captured >= ROWS

        # 3. Restarted on it: captures everything, within the bound.
        pair.pub = pair.publisher_daemon()
        busy = start_sampled(pair.pub, every=0.05)
        wait_until(
            lambda: src.execute("SELECT count(*) FROM _txrepl_capture").fetchone()[0] == 0,
            60,
            "the backlog captured and released",
        )
        busy.stop()
        pair.pub.stop()
        peak_kib = max(s[3] for s in busy.samples)
        assert peak_kib <= idle_kib + ALLOWANCE_KIB, (
            f"the publisher's anonymous RSS reached {peak_kib // 1024} MiB capturing a "
            f"{ROWS * VALUE_BYTES // 10**6} MB backlog; bound {(idle_kib + ALLOWANCE_KIB) // 1024} "
            f"MiB (idle {idle_kib // 1024} MiB + 16 x max_entry_bytes)"
        )
        assert _logged_ids(pair) == list(range(1, ROWS + 1))
    finally:
        pair.stop()
        src.close()
