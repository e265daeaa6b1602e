"""MariaDB as a source end to end: real daemons, the binary log, a kill -9, a reinit.

A writer thread commits W1 transactions, each with one ``ledger`` row (id = its
number) and ``counter.n += 1``, into a private mariadbd (binary log on) while the
publisher captures them and a subscriber applies them into SQLite.  The publisher is
killed (SIGKILL) mid-stream and started again on its port: afterwards the SQLite
target equals the MariaDB source row for row, and the publication's log holds every
ledger row's INSERT exactly once (nothing lost, nothing captured twice across the
kill).  Then the target drifts and a reinit (the Snapshot RPC over the MariaDB source)
puts it right at the head's seq.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import decode
from publisher.log import open_log
from tests.support.harness import Pair, wait_until
from tests.support.workload import W1, W1_COLUMNS, diff_tables, maria_source, run_maria

pytestmark = [pytest.mark.mariadb, pytest.mark.spark]

TABLES = ["accounts", "orders", "counter", "ledger"]
COLUMNS = {**W1_COLUMNS, "counter": ("id", "n"), "ledger": ("id", "txn", "note")}


class Writer(threading.Thread):
    """W1 + ledger transactions on the MariaDB source, as fast as it takes them, until halted."""

    def __init__(self, url: str) -> None:
        super().__init__(name="maria-writer", daemon=True)
        self.conn = maria_source(url)
        with self.conn.cursor() as cur:
            cur.execute("CREATE TABLE counter(id BIGINT PRIMARY KEY, n BIGINT NOT NULL)")
            cur.execute(
                "CREATE TABLE ledger(id BIGINT PRIMARY KEY, txn BIGINT NOT NULL, note TEXT)"
            )
            cur.execute("INSERT INTO counter VALUES (1, 0)")
        self.conn.commit()
        self.w1 = W1(accounts=50)
        run_maria(self.conn, [self.w1.transaction()])  # W1's transaction 0: the accounts
        self.committed = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def txn(self) -> None:
        t = self.committed + 1
        stmts = self.w1.transaction()
        stmts.append(("UPDATE counter SET n = n + 1 WHERE id = 1", ()))
        stmts.append(("INSERT INTO ledger VALUES ({p}, {p}, {p})", (t, t, f"txn {t}")))
        run_maria(self.conn, [stmts])
        self.committed = t

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.txn()
                self.halt.wait(0.005)
        except BaseException as e:  # the test must see it
            self.error = e

    def stop(self) -> int:
        self.halt.set()
        self.join(30)
        self.conn.close()
        if self.error is not None:
            raise self.error
        return self.committed


def _equal(url: str, target: Path) -> list[str]:
    """Differences between the MariaDB source and the SQLite target (empty: equal)."""
    import pymysql

    from common.dburl import mariadb_params

    src = pymysql.connect(**mariadb_params(url))
    dst = sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=30)
    try:
        return diff_tables(src, dst, COLUMNS)
    except sqlite3.Error as e:  # the target's tables may not be there yet
        return [str(e)]
    finally:
        src.close()
        dst.close()


def _ledger_inserts(log_dir: Path) -> list[int]:
    """The id of every ledger INSERT in the publication's log, in log order."""
    log = open_log(log_dir, create=False)
    ids: list[int] = []
    try:
        seq = log.first_seq
        while seq <= log.head:
            batch = log.read(seq, max_entries=1000)
            for raw in batch:
                for op in pb.Entry.FromString(raw).ops:
                    rc = op.row
                    if op.HasField("row") and rc.table == "ledger" and rc.op == pb.ROW_OP_INSERT:
                        ident = decode(rc.row[0])
                        assert isinstance(ident, int)
                        ids.append(ident)
            seq += len(batch)
    finally:
        log.close()
    return ids


def test_publisher_sigkill_mid_stream_from_mariadb_loses_and_doubles_nothing(
    tmp_path: Path, maria_db: str, spark: Any
) -> None:
    """SIGKILL of the publisher while it captures MariaDB's binary log: after its restart
    the SQLite target equals the source and the log holds each ledger row once."""
    writer = Writer(maria_db)
    pair = Pair(tmp_path, tables=TABLES, source_url=maria_db)
    try:
        pub = pair.start_publisher()
        port = pub.address.rsplit(":", 1)[1]
        writer.start()
        pair.start_subscriber()
        wait_until(lambda: pair.status().level > 0, 180, "a first applied batch")
        before = pair.head()
        wait_until(lambda: pair.head() > before + 20, 60, "capture to be streaming")
        assert writer.is_alive(), writer.error
        assert pair.pub is not None
        pair.pub.kill()  # mid-stream: the writer never stops
        killed_at = writer.committed
        pair.start_publisher(listen=f"127.0.0.1:{port}")
        wait_until(lambda: writer.committed > killed_at + 20, 60, "more source commits")
        committed = writer.stop()
        wait_until(lambda: not _equal(maria_db, pair.target_path), 180, "target = source")
        head = pair.wait_caught_up()
        # A reinit rebuilds a drifted target from a snapshot pinned at a GTID.
        assert pair.sub is not None
        pair.sub.stop()
        dst = sqlite3.connect(pair.target_path)
        dst.execute("DELETE FROM orders WHERE id % 2 = 0")
        dst.commit()
        dst.close()
        assert pair.load_snapshot(pair.target_path, spark=spark) == head
    finally:
        if writer.is_alive():
            writer.halt.set()
        pair.stop()
    assert not _equal(maria_db, pair.target_path)
    ids = _ledger_inserts(tmp_path / "publisher" / "publications" / pair.publication)
    assert sorted(ids) == list(range(1, committed + 1)), "a ledger row lost or logged twice"
