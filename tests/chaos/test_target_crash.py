"""SIGKILL the TARGET PostgreSQL server under a stream: its unflushed commits are lost.

The subscriber commits batches of rows with ``synchronous_commit = off``
(subscriber/targets/postgres/_durable.py), so a crash of the target's server loses
the commits whose WAL was not yet written out.  To make that loss certain, not a
matter of timing, the server's WAL writer is stopped (SIGSTOP) before the commits
that are to be lost: nothing flushes them (autovacuum and the background writer
are off on that server), and the SIGKILL of every server process drops them with
the WAL buffers.  Then:

* the publisher was never told a level the target lost (its registry's level,
  ``Admin.ListSubscribers``, is at most the level the restarted target holds);
* the subscriber resumes from the level the target kept, not from the one it
  applied in memory: the target ends equal to the source row by row, every ledger
  row present and written exactly once (a trigger ``ENABLE ALWAYS`` counts them).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from tests.fixtures.postgres import PgServer, start_pg_instance
from tests.support.chaos_stream import LEDGER_COLUMNS, TABLES, StreamWriter
from tests.support.harness import Pair, wait_until
from tests.support.workload import W1_COLUMNS, diff_tables, w1_checksum

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

# The target's ledger as the writer would create it, and a trigger counting every
# write of a ledger row by the subscriber (replica role: only ALWAYS triggers fire).
_TARGET = """
CREATE TABLE ledger (id bigint PRIMARY KEY, txn bigint NOT NULL, note text);
CREATE TABLE apply_count (id bigint PRIMARY KEY, n bigint NOT NULL);
CREATE FUNCTION count_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO apply_count VALUES (NEW.id, 1)
        ON CONFLICT (id) DO UPDATE SET n = apply_count.n + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_count AFTER INSERT OR UPDATE ON ledger
    FOR EACH ROW EXECUTE FUNCTION count_apply();
ALTER TABLE ledger ENABLE ALWAYS TRIGGER ledger_count;
"""


@pytest.fixture
def target_server() -> Iterator[PgServer]:
    # Nothing but the WAL writer and our own commits may flush the WAL.
    with start_pg_instance(autovacuum="off", bgwriter_lru_maxpages=0) as server:
        yield server


def _server_pids(server: PgServer) -> tuple[int, list[int]]:
    """The postmaster's pid and its children's."""
    postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry))
    return postmaster, children


def _stop_wal_writer(server: PgServer) -> int:
    _, children = _server_pids(server)
    for pid in children:
        if "walwriter" in Path(f"/proc/{pid}/cmdline").read_text():
            os.kill(pid, signal.SIGSTOP)
            return pid
    raise AssertionError("no walwriter process found")


def _kill_server(server: PgServer) -> None:
    """SIGKILL the postmaster and every server process (WAL buffers gone with them)."""
    postmaster, children = _server_pids(server)
    os.kill(postmaster, signal.SIGKILL)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):  # a backend that just ended
            os.kill(pid, signal.SIGKILL)
    for pid in [postmaster, *children]:
        wait_until(functools.partial(_gone, pid), 30, f"server process {pid} to end")


def _gone(pid: int) -> bool:
    # Reaped, not only dead: a new postmaster refuses to start while the pid in its
    # lock file answers kill(pid, 0), which a zombie does.
    return not Path(f"/proc/{pid}").exists()


def _target_level(dsn: str) -> int:
    """The level the target holds (0: none, the level row or its table lost)."""
    with psycopg.connect(dsn) as conn:
        try:
            row = conn.execute("SELECT level FROM txrepl_subscriptions").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
    return 0 if row is None else int(row[0])


def _publisher_level(pair: Pair) -> int:
    assert pair.pub is not None
    with grpc.insecure_channel(pair.pub.address) as ch:
        resp = rpc.AdminStub(ch).ListSubscribers(pb.ListSubscribersRequest(), timeout=10)
    (info,) = resp.subscribers
    return int(info.level)


def _pair(tmp_path: Path, server: PgServer) -> tuple[Pair, str]:
    dsn = server.create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_TARGET)
    return Pair(tmp_path, tables=TABLES, target_url=dsn), dsn


def _verify(pair: Pair, dsn: str, committed: int) -> None:
    """Target = source row by row; every ledger row there, written exactly once."""
    columns = {**W1_COLUMNS, **LEDGER_COLUMNS}

    def equal() -> bool:
        src = sqlite3.connect(str(pair.source_path))
        try:
            with psycopg.connect(dsn) as dst:
                return not diff_tables(src, dst, columns, limit=1)
        except psycopg.Error:
            return False
        finally:
            src.close()

    try:
        wait_until(equal, 180, "the target to equal the source", interval=0.25)
    except TimeoutError:
        src = sqlite3.connect(str(pair.source_path))
        with psycopg.connect(dsn) as dst:
            problems = diff_tables(src, dst, columns)
        raise AssertionError("target differs from source:\n" + "\n".join(problems)) from None
    src = sqlite3.connect(str(pair.source_path))
    try:
        with psycopg.connect(dsn) as dst:
            assert w1_checksum(src) == w1_checksum(dst)
            (n,) = dst.execute("SELECT n FROM counter WHERE id = 1").fetchone()  # type: ignore[misc]
            (rows, lo, hi) = dst.execute(  # type: ignore[misc]
                "SELECT count(*), min(id), max(id) FROM ledger"
            ).fetchone()
            twice = dst.execute("SELECT id, n FROM apply_count WHERE n <> 1 LIMIT 5").fetchall()
            (counted,) = dst.execute("SELECT count(*) FROM apply_count").fetchone()  # type: ignore[misc]
    finally:
        src.close()
    assert n == rows == committed, f"counter {n}, ledger rows {rows}, committed {committed}"
    assert (lo, hi) == (1, committed)
    assert counted == committed, f"{counted} ledger rows counted on the target"
    assert not twice, f"ledger rows written more than once: {twice}"


def test_target_crash_mid_stream_loses_and_duplicates_nothing(
    tmp_path: Path, target_server: PgServer
) -> None:
    """The target's server killed mid-stream (its last commits lost): once it is back
    the subscriber resumes from the target's level and the target equals the source,
    every transaction applied exactly once."""
    pair, dsn = _pair(tmp_path, target_server)
    writer = StreamWriter(pair.source_path, rate=100)
    try:
        pair.start_publisher()
        writer.start()
        pair.start_subscriber()
        wait_until(lambda: pair.status().level > 0, 180, "a first applied batch")
        time.sleep(1.0)
        _stop_wal_writer(target_server)  # from here on nothing is flushed
        time.sleep(1.5)  # ~150 transactions applied, none of them durable
        applied = pair.status().level
        _kill_server(target_server)
        time.sleep(0.5)  # the stream goes on; the subscriber's batches fail
        target_server.start()
        print(f"injected: SIGKILL of the target server at applied level {applied}")
        time.sleep(2.0)  # more of the stream after the restart
        committed = writer.stop()
        _verify(pair, dsn, committed)
        assert pair.status().state == "in_sync"
    finally:
        if writer.is_alive():
            writer.halt.set()
        pair.stop()


def test_publisher_never_told_a_level_the_target_lost(
    tmp_path: Path, target_server: PgServer
) -> None:
    """Levels applied but not yet flushed on the target are not acknowledged: after
    the target's crash the publisher's recorded level is one the target still holds
    (its retention may drop everything up to it)."""
    pair, dsn = _pair(tmp_path, target_server)
    writer = StreamWriter(pair.source_path, rate=200, limit=40)
    try:
        pair.start_publisher()
        writer.start()
        pair.start_subscriber()
        writer.join(60)
        head = pair.wait_caught_up()
        wait_until(lambda: _publisher_level(pair) == head, 60, "the ack of the flushed level")
        _stop_wal_writer(target_server)
        for _ in range(40):  # on the test's thread: the writer's has ended
            writer._txn(writer.w1.transaction())
        head = pair.wait_caught_up()  # applied, not flushed
        time.sleep(1.0)  # time enough for any ack to reach the publisher's registry
        acked = _publisher_level(pair)
        assert pair.sub is not None
        pair.sub.kill()  # so that it does not reconnect before the target's level is read
        _kill_server(target_server)
        target_server.start()
        kept = _target_level(dsn)
        print(f"injected: SIGKILL of the target server; head {head}, acked {acked}, kept {kept}")
        assert kept < head, "the crash lost nothing: the test did not test anything"
        assert acked <= kept, f"the publisher was told level {acked}, the target kept {kept}"
        pair.start_subscriber()
        _verify(pair, dsn, writer.committed)
    finally:
        pair.stop()
