"""The capture contract, run against every source (SQLite, PostgreSQL, MariaDB) through ``Source``.

Each test gets a ``db``: one real source database of some dialect, a way to commit
statements in ONE transaction, and a way to open a fresh :class:`Source` on it
(through the dialect registry, as the daemon does).  Nothing is mocked: the
PostgreSQL variant runs on the private server of tests/fixtures/postgres.py, the
MariaDB one on the private mariadbd of tests/fixtures/mariadb.py (binary log on).
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.dburl import DatabaseUrl
from common.rpc import txrepl_pb2 as pb
from common.values import decode
from publisher.capture import Source, SourceOptions
from publisher.capture.dialects import open_source
from publisher.capture.thread import CaptureThread
from publisher.errors import SourceError
from publisher.publication import Publication
from tests.support.pg_capture import open_pub, read_entries, row_ops, wait_for
from tests.support.workload import maria_commit

TABLE = "CREATE TABLE t(id integer PRIMARY KEY, v text)"

# Each transaction: its statements; the row ops it must produce, in order.
TXNS: list[tuple[list[str], list[tuple[str, int, object]]]] = [
    (["INSERT INTO t VALUES (3, 'c')", "UPDATE t SET v = 'a2' WHERE id = 1"],
     [("INSERT", 3, "c"), ("UPDATE", 1, "a2")]),
    (["DELETE FROM t WHERE id = 2", "INSERT INTO t VALUES (4, 'd')"],
     [("DELETE", 2, None), ("INSERT", 4, "d")]),
    (["UPDATE t SET v = 'c2' WHERE id = 3"], [("UPDATE", 3, "c2")]),
]  # fmt: skip


@dataclass
class SourceDb:
    """One source database of some dialect, with table ``t`` holding rows 1 and 2."""

    name: str
    url: DatabaseUrl
    slot: str

    def commit(self, *statements: str) -> None:
        """Run ``statements`` in one source transaction."""
        if self.url.is_sqlite:
            conn = sqlite3.connect(self.url.sqlite_path, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                for s in statements:
                    conn.execute(s)
                conn.execute("COMMIT")
            finally:
                conn.close()
        elif self.name == "mariadb":
            maria_commit(self.url.raw, *statements)
        else:
            import psycopg

            with psycopg.connect(self.url.raw) as pg:
                for s in statements:
                    pg.execute(s.encode())

    def open(self) -> Source:
        return open_source(self.url, SourceOptions(slot=self.slot, poll_interval_s=0.005))


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> SourceDb:
    if request.param == "sqlite":
        path = tmp_path / "source.db"
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        url = DatabaseUrl.parse(f"sqlite:///{path}")
    elif request.param == "mariadb":
        url = DatabaseUrl.parse(request.getfixturevalue("maria_db"))
    else:
        url = DatabaseUrl.parse(request.getfixturevalue("pg_db"))
    source_db = SourceDb(request.param, url, "contract")
    source_db.commit(TABLE, "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')")
    return source_db


class Streaming:
    """A source installed for ``pub`` and streaming in a CaptureThread."""

    def __init__(self, db: SourceDb, pub: Publication) -> None:
        self.pub = pub
        self.source = db.open()
        # before the capture thread starts: a source is used by one thread at a time
        self.installed = self.source.install(pub.name, pub.log.incarnation, pub.config.tables)
        self.thread = CaptureThread(self.source, [pub])
        self.thread.start()

    def wait_rows(self, n: int) -> None:
        """Until the log holds ``n`` data row ops (snapshot rows included)."""
        wait_for(lambda: len(_data_ops(read_entries(self.pub))) >= n, 30, f"{n} row ops")

    def stop(self) -> None:
        self.thread.halt.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "capture did not stop"
        self.source.release()


def _data_ops(entries: list[pb.Entry]) -> list[tuple[str, int, object]]:
    """(op, id, v) of every row op but TRUNCATE (PostgreSQL's snapshot starts with one)."""
    out: list[tuple[str, int, object]] = []
    for table, op, key, row in row_ops(entries):
        assert table == "t"
        if op == "TRUNCATE":
            continue
        ident = key[0] if op == "DELETE" else row[0]
        assert isinstance(ident, int)
        out.append((op, ident, row[1] if row else None))
    return out


SNAPSHOT = [("INSERT", 1, "a"), ("INSERT", 2, "b")]
AFTER = [op for _, ops in TXNS for op in ops]


def test_install_logs_schema_and_rows_then_whole_transactions_in_commit_order(
    db: SourceDb, tmp_path: Path
) -> None:
    """The schema and existing rows come first; each transaction lands whole, in order."""
    pub = open_pub(tmp_path / "logs", "p", ["t"])
    run = Streaming(db, pub)
    try:
        run.wait_rows(2)
        for statements, _ in TXNS:
            db.commit(*statements)
        run.wait_rows(2 + len(AFTER))
    finally:
        run.stop()
    entries = read_entries(pub)
    assert entries[0].ops[0].schema.table == "t"
    assert list(entries[0].ops[0].schema.primary_key) == ["id"]
    assert _data_ops(entries) == SNAPSHOT + AFTER
    # Whole transactions: every transaction's ops sit in one entry (an entry may
    # hold several consecutive transactions, never part of one).
    txn_of = [i for i, (_, ops) in enumerate(TXNS) for _ in ops]
    entry_of = [n for n, e in enumerate(entries) for _ in _data_ops([e])][len(SNAPSHOT) :]
    for i in range(len(TXNS)):
        assert len({e for e, t in zip(entry_of, txn_of, strict=True) if t == i}) == 1
    positions = [int(e.source_position) for e in entries]
    assert positions == sorted(positions)


def test_restart_resumes_after_the_last_logged_position(db: SourceDb, tmp_path: Path) -> None:
    """Stopped, restarted on the same log: nothing committed meanwhile is lost or doubled."""
    logs = tmp_path / "logs"
    pub = open_pub(logs, "p", ["t"])
    run = Streaming(db, pub)
    try:
        run.wait_rows(2)
        db.commit(*TXNS[0][0])
        run.wait_rows(2 + len(TXNS[0][1]))
    finally:
        run.stop()
    pub.log.close()
    db.commit(*TXNS[1][0])  # while capture is down
    pub = open_pub(logs, "p", ["t"])
    run = Streaming(db, pub)
    try:
        assert run.installed == []  # same incarnation: nothing added again
        db.commit(*TXNS[2][0])
        run.wait_rows(2 + len(AFTER))
    finally:
        run.stop()
    assert _data_ops(read_entries(pub)) == SNAPSHOT + AFTER
    pub.log.close()


def _replay(entries: list[pb.Entry]) -> dict[int, object]:
    """The table ``t`` after applying ``entries`` in order."""
    state: dict[int, object] = {}
    for e in entries:
        for op in e.ops:
            if op.WhichOneof("kind") != "row":
                continue
            rc = op.row
            if rc.op == pb.ROW_OP_TRUNCATE:
                state.clear()
                continue
            if rc.op in (pb.ROW_OP_UPDATE, pb.ROW_OP_DELETE):
                del state[int(str(decode(rc.key[0])))]
            if rc.op in (pb.ROW_OP_INSERT, pb.ROW_OP_UPDATE):
                state[int(str(decode(rc.row[0])))] = decode(rc.row[1])
    return state


def test_snapshot_at_a_seq_is_the_state_after_the_log_up_to_it(
    db: SourceDb, tmp_path: Path
) -> None:
    """Taken while writers commit, a snapshot's rows equal the log replayed up to its seq."""
    pub = open_pub(tmp_path / "logs", "p", ["t"])
    run = Streaming(db, pub)
    stop = threading.Event()

    def write() -> None:
        i = 10
        while not stop.is_set():
            db.commit(f"INSERT INTO t VALUES ({i}, 'w')", f"UPDATE t SET v = 'u{i}' WHERE id = 1")
            i += 1

    writer = threading.Thread(target=write, daemon=True)
    try:
        run.wait_rows(2)
        writer.start()
        wait_for(lambda: pub.log.head >= 4, 30, "a few transactions logged")
        with run.source.snapshot(pub, timeout_s=30) as snap:
            [(schema, count)] = snap.tables
            rows = {}
            for chunk in snap.chunks(schema, 7):
                for r in chunk.rows.rows:
                    rows[int(str(decode(r.values[0])))] = decode(r.values[1])
        stop.set()
        writer.join(30)
    finally:
        stop.set()
        run.stop()
    assert schema.table == "t"
    assert count == len(rows)
    assert 2 < snap.seq <= pub.log.head
    assert rows == _replay(read_entries(pub)[: snap.seq])
    pub.log.close()


@pytest.mark.parametrize(
    ("tables", "message"),
    [(["t", "nokey"], r"'nokey'.*no PRIMARY KEY"), (["t", "ghost"], r"'ghost' does not exist")],
)
def test_a_table_without_primary_key_or_missing_is_refused_by_name(
    db: SourceDb, tables: list[str], message: str
) -> None:
    """Installing a table capture cannot replicate fails with a SourceError naming it."""
    db.commit("CREATE TABLE nokey(a integer, b text)")
    source = db.open()
    try:
        with pytest.raises(SourceError, match=message):
            source.install("p", "inc", tables)
    finally:
        source.release()
