"""Re-initialisation into a PostgreSQL target: shadow tables swapped in one transaction.

Real daemons, a real private PostgreSQL (tests/fixtures/postgres.py), the real
``txrepl subscriber reinit`` command, SIGKILLed at two points: in the middle of
the load, and while its swap waits for a reader's lock.
"""

from __future__ import annotations

import decimal
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.reinit import SnapshotError
from subscriber.targets import load_snapshot
from tests.support.harness import ROOT, Pair, wait_until
from tests.support.workload import (
    W1,
    W1_COLUMNS,
    diff_tables,
    run_sqlite,
    sqlite_source,
    w1_checksum,
)

ACCOUNTS = 50_000  # several flushes (20,000 rows each): the first kill lands mid-load


def _bursts(
    src: sqlite3.Connection, w1: W1, n: int, size: int = 3, pair: Pair | None = None
) -> None:
    """``n`` bursts of W1 transactions, apart enough to become separate entries (with
    ``pair``: each waits for the publisher's head to move, since one capture poll
    makes one entry of what it finds)."""
    for _ in range(n):
        head = pair.head() if pair is not None else 0
        run_sqlite(src, w1.transactions(size))
        if pair is not None:
            wait_until(lambda h=head: pair.head() > h, 30, "the burst's entry")  # type: ignore[misc]
        else:
            time.sleep(0.03)


def _reinit(pair: Pair) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        pair.reinit_argv(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _read_until(proc: subprocess.Popen[bytes], marker: bytes, timeout: float) -> bytes:
    """Read the process's output until ``marker`` shows (progress lines end with \\r)."""
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + timeout
    while marker not in out:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {marker!r} in {out!r}")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise AssertionError(f"reinit ended before {marker!r}: {out!r}")
        out += chunk
    return out


def _level(dsn: str) -> tuple[int, str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT level, incarnation FROM txrepl_subscriptions WHERE subscription = 'pub1.shop'"
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def _no_reinit_session(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'txrepl-reinit'"
        ).fetchone()
    return row is not None and row[0] == 0


def _shadows(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'txrepl_shadow'"
        ).fetchall()
    return [r[0] for r in rows]


class Reader(threading.Thread):
    """Counts ``accounts`` on the target in a loop: every count must be a whole table."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.counts: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                try:
                    row = conn.execute("SELECT count(*) FROM accounts").fetchone()
                    assert row is not None
                    self.counts.append(int(row[0]))
                except psycopg.Error as e:
                    self.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.005)


def _wait_equal(src: sqlite3.Connection, dsn: str, timeout: float = 120) -> None:
    def equal() -> bool:
        with psycopg.connect(dsn) as dst:
            try:
                return w1_checksum(src) == w1_checksum(dst)
            except psycopg.Error:
                return False

    try:
        wait_until(equal, timeout, "PostgreSQL to equal the SQLite source", interval=0.3)
    except TimeoutError:
        with psycopg.connect(dsn) as dst:
            raise AssertionError("\n".join(diff_tables(src, dst, W1_COLUMNS))) from None


@pytest.mark.postgres
@pytest.mark.spark
def test_pg_target_invalid_then_reinit_killed_twice_then_valid_and_converges(
    tmp_path: Path, pg_server: Any
) -> None:
    """Snapshot at start; max_delta → invalid; reinit refused by a view, killed mid-load,
    killed in its swap; a reader never sees a partial table; reinit → valid → equal."""
    dsn = pg_server.create_database()
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders"],
        target_url=dsn,
        publication_extra={"max_delta": 8},
        subscription_extra={"initial": "snapshot"},
    )
    src = sqlite_source(pair.source_path)
    w1 = W1(accounts=ACCOUNTS)
    run_sqlite(src, w1.transactions(21))  # the accounts, then 20 order transactions
    reader = Reader(dsn)
    try:
        pair.start_publisher()
        sub = pair.start_subscriber()
        _wait_equal(src, dsn)  # the daemon loaded a snapshot first (initial = "snapshot")
        assert any("snapshot" in t.reason for t in pair.status().timeline)
        pair.wait_caught_up(timeout=60)

        # Fall more than max_delta entries behind while paused: invalid on resume.
        from tests.support.harness import subscriber_control

        control = subscriber_control(sub.address)
        control.Pause(pb.SubscriptionRequest(subscription="pub1.shop"), timeout=10)
        _bursts(src, w1, 12, pair=pair)
        control.Resume(pb.SubscriptionRequest(subscription="pub1.shop"), timeout=10)
        wait_until(lambda: pair.status().state == "invalid", 60, "the subscriber to be invalid")
        assert "max_delta" in pair.status().last_error
        level0 = _level(dsn)
        with psycopg.connect(dsn) as conn:
            before = conn.execute("SELECT count(*) FROM accounts").fetchone()
        reader.start()

        # Bad input: a view on a replicated table makes the swap impossible → clear error.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE VIEW rich AS SELECT * FROM accounts WHERE balance > 0")
        proc = _reinit(pair)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1, out
        assert b"depend" in out, out
        assert b"the target is unchanged" in out, out
        assert b"Traceback" not in out, out
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP VIEW rich")
        assert _level(dsn) == level0

        # Kill 1: in the middle of the load (after the first 20,000 rows were copied).
        proc = _reinit(pair)
        _read_until(proc, b"rows/s", 120)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        wait_until(lambda: _no_reinit_session(dsn), 30, "the killed reinit's session to end")
        assert _level(dsn) == level0
        assert _shadows(dsn) == []

        # Kill 2: while the swap waits for the lock a reader's transaction holds.
        with psycopg.connect(dsn) as holder:
            holder.execute("SELECT count(*) FROM accounts").fetchone()  # opens a transaction
            proc = _reinit(pair)

            def swap_waiting() -> bool:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                        " 'txrepl-reinit' AND wait_event_type = 'Lock'"
                    ).fetchone()
                return row is not None and row[0] > 0

            wait_until(swap_waiting, 120, "the reinit's swap to wait for the reader's lock")
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL
            assert proc.stdout is not None
            proc.stdout.close()
            holder.rollback()
        wait_until(lambda: _no_reinit_session(dsn), 30, "the killed reinit's session to end")
        assert _level(dsn) == level0
        assert _shadows(dsn) == []

        # Run again, to the end: valid, resumed, converges.
        proc = _reinit(pair)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        assert b"marked sub1 valid" in out, out
        assert b"resumed pub1.shop" in out, out
        reader.stop.set()
        reader.join(10)
        with psycopg.connect(dsn) as conn:
            after = conn.execute("SELECT count(*) FROM accounts").fetchone()
        level, incarnation = _level(dsn)
        assert level > level0[0]
        assert incarnation == level0[1]
        assert before is not None
        assert after is not None
        assert reader.counts
        assert set(reader.counts) <= {before[0], after[0]}, sorted(set(reader.counts))
        assert reader.errors == []
        _bursts(src, w1, 2)
        _wait_equal(src, dsn)
        wait_until(lambda: pair.status().state == "in_sync", 60, "in sync after reinit")
        with psycopg.connect(dsn) as conn:
            pk = conn.execute(
                "SELECT conname FROM pg_constraint WHERE conrelid = 'accounts'::regclass"
                " AND contype = 'p'"
            ).fetchone()
        assert pk == ("accounts_pkey",)
    finally:
        reader.stop.set()
        pair.stop()


def test_snapshot_into_an_unknown_target_kind_is_refused() -> None:
    with pytest.raises(SnapshotError, match="snapshots load into a SQLite file, postgresql"):
        load_snapshot(
            address="127.0.0.1:1",
            publisher="p",
            publication="x",
            subscriber="s",
            subscription="p.x",
            target="oracle://u@h/db",
        )


@pytest.mark.postgres
def test_snapshot_from_a_postgresql_source_is_exactly_the_log_at_its_seq(
    tmp_path: Path, pg_server: Any
) -> None:
    """PostgreSQL source under a steady write load: each snapshot loaded into PostgreSQL
    equals the log's entries 1..S replayed (no transaction missing or doubled)."""
    from publisher.log import open_log
    from tests.support.reference import ReferenceTarget
    from tests.support.workload import SQLITE_SCHEMA, pg_source, run_pg

    src_dsn = pg_server.create_database()
    src = pg_source(src_dsn)
    w1 = W1(accounts=500)
    run_pg(src, w1.transactions(51))
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders"],
        source_url=src_dsn,
        publisher_extra={"slot": "txrepl_reinit_src"},
    )
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:
        with psycopg.connect(src_dsn, autocommit=True) as conn:
            while not stop.is_set():
                written.append(run_pg(conn, w1.transactions(1)))
                time.sleep(0.002)

    loads: list[tuple[int, str]] = []
    try:
        pub = pair.start_publisher()
        wait_until(lambda: pair.head() > 0, 60, "the install snapshot in the log")

        def snapshot(chunk_rows: int = 5000) -> tuple[int, str]:  # load_snapshot's default
            """Load a snapshot into a new database; its seq and the database."""
            dst_dsn = pg_server.create_database()
            _incarnation, seq = load_snapshot(
                address=pub.address,
                publisher="pub1",
                publication="shop",
                subscriber="sub1",
                subscription="pub1.shop",
                target=dst_dsn,
                chunk_rows=chunk_rows,
            )
            return seq, dst_dsn

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        for _ in range(2):
            goal = len(written) + 30
            wait_until(lambda: len(written) >= goal, 60, "more transactions")  # noqa: B023
            loads.append(snapshot(chunk_rows=100))  # several chunks per table
        stop.set()
        t.join(30)
        wait_until(lambda: pair.head() > loads[-1][0], 30, "entries after the last snapshot")
        time.sleep(1.0)  # the source is idle now: the stream reaches C by a keepalive
        head = pair.head()
        seq, dst_dsn = snapshot()
        assert seq == head
        loads.append((seq, dst_dsn))
    finally:
        stop.set()
        pair.stop()
        src.close()
    log = open_log(tmp_path / "publisher" / "publications" / "shop", create=False)
    try:
        entries = [
            pb.Entry.FromString(p) for p in log.read(1, max_entries=1_000_000, max_bytes=1 << 30)
        ]
    finally:
        log.close()
    assert loads[0][0] < loads[1][0] < loads[2][0] == len(entries)
    for seq, dst_dsn in loads:
        ref = ReferenceTarget()
        ref.apply_all(1, entries[:seq])
        mem = sqlite3.connect(":memory:")
        mem.executescript(SQLITE_SCHEMA)
        for table, rows in ref.snapshot().items():
            name = table.rsplit(".", 1)[-1]
            marks = ", ".join("?" * len(ref.schemas[table].columns))
            mem.executemany(
                f"INSERT INTO {name} VALUES ({marks})",
                [tuple(str(v) if isinstance(v, decimal.Decimal) else v for v in r) for r in rows],
            )
        with psycopg.connect(dst_dsn) as dst:
            assert w1_checksum(mem) == w1_checksum(dst), "\n".join(
                diff_tables(mem, dst, W1_COLUMNS)
            )
            level = dst.execute("SELECT level FROM txrepl_subscriptions").fetchone()
        assert level == (seq,)


_CARRIED = """
SELECT 'constraint', conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
 WHERE conrelid = 'orders'::regclass AND contype <> 'p'
UNION ALL SELECT 'index', indexdef FROM pg_indexes WHERE tablename = 'orders'
UNION ALL SELECT 'trigger', tgname || ' ' || tgenabled::text FROM pg_trigger
 WHERE tgrelid = 'orders'::regclass AND NOT tgisinternal
UNION ALL SELECT 'grant', grantee || ' ' || privilege_type FROM information_schema.role_table_grants
 WHERE table_name = 'orders' AND grantee = 'txrepl_reader'
UNION ALL SELECT 'options', array_to_string(reloptions, ',') FROM pg_class
 WHERE oid = 'orders'::regclass
UNION ALL SELECT 'comment', coalesce(obj_description('orders'::regclass, 'pg_class'), '')
 || '/' || coalesce(col_description('orders'::regclass, 4), '')
ORDER BY 1, 2
"""


@pytest.mark.postgres
def test_reinit_carries_indexes_constraints_triggers_grants_and_comments_over(
    tmp_path: Path, pg_server: Any
) -> None:
    """What an operator added to a replicated table survives a reinit; what cannot be
    re-created on the new table fails the reinit by name and changes nothing."""
    src = sqlite_source(tmp_path / "source.db")
    w1 = W1(accounts=300)
    run_sqlite(src, w1.transactions(200))
    pair = Pair(tmp_path, tables=["accounts", "orders"])
    dsn = pg_server.create_database()

    def load() -> int:
        return pair.load_snapshot(dsn)

    try:
        pair.start_publisher()
        wait_until(lambda: pair.head() > 0, 60, "the source in the log")
        load()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE ROLE txrepl_reader")
            conn.execute(
                """
                CREATE INDEX orders_by_account ON orders (account_id) WHERE status = 'new';
                ALTER TABLE orders ADD CONSTRAINT positive CHECK (amount > 0);
                CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql
                  AS 'BEGIN RETURN NEW; END';
                CREATE TRIGGER audit BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION noop();
                ALTER TABLE orders ENABLE ALWAYS TRIGGER audit;
                GRANT SELECT ON orders TO txrepl_reader;
                ALTER TABLE orders SET (fillfactor = 70);
                COMMENT ON TABLE orders IS 'replica of shop.orders';
                COMMENT ON COLUMN orders.status IS 'new or shipped';
                """
            )
            before = conn.execute(_CARRIED).fetchall()
            oid = conn.execute("SELECT 'orders'::regclass::oid").fetchone()
        assert len(before) == 7, before
        run_sqlite(src, w1.transactions(50))
        wait_until(lambda: pair.head() > 0, 60, "more in the log")
        time.sleep(0.5)
        load()
        with psycopg.connect(dsn) as conn:
            assert conn.execute(_CARRIED).fetchall() == before
            assert conn.execute("SELECT 'orders'::regclass::oid").fetchone() != oid  # new table
            assert w1_checksum(src) == w1_checksum(conn)

        # Something that cannot be re-created: an index on a column the publisher
        # does not send.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE orders ADD COLUMN extra int")
            conn.execute("CREATE INDEX orders_extra ON orders (extra)")
            level = _level(dsn)
            content = w1_checksum(conn)
        run_sqlite(src, w1.transactions(20))
        time.sleep(0.5)
        with pytest.raises(SnapshotError, match="index 'orders_extra' of 'orders'"):
            load()
        assert _level(dsn) == level
        with psycopg.connect(dsn) as conn:
            assert w1_checksum(conn) == content
            assert conn.execute("SELECT 'orders'::regclass::oid").fetchone() != oid
            assert len(conn.execute(_CARRIED).fetchall()) == 8  # orders_extra too
        assert _shadows(dsn) == []
    finally:
        pair.stop()
        src.close()


@pytest.mark.postgres
@pytest.mark.spark
def test_snapshot_of_a_transformed_table_into_postgresql_equals_replication(
    tmp_path: Path, pg_server: Any, spark: Any
) -> None:
    """A table with transforms loads from a snapshot into exactly the rows replication
    built (every W1 type, TIMESTAMPTZ and NUMERIC included, through the expressions)."""
    from subscriber.apply import ApplyOptions
    from subscriber.config import ApplyConfig, TableApplyConfig

    shaping = {
        "target": "wallets",
        "rename": {"owner": "holder"},
        "computed": {"doubled": "balance * 2", "day": "substr(updated_at, 1, 10)"},
        "filter": "balance % 2 = 0",
    }
    src = sqlite_source(tmp_path / "source.db")
    replicated = pg_server.create_database()
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders"],
        target_url=replicated,
        subscriber_extra={"apply": {"tables": {"accounts": shaping}}},
    )
    w1 = W1(accounts=400)
    tables = ApplyOptions.from_config(
        ApplyConfig(tables={"accounts": TableApplyConfig(**shaping)})  # type: ignore[arg-type]
    ).tables
    wallets = "SELECT * FROM wallets ORDER BY id"
    try:
        pair.start_publisher()
        pair.start_subscriber()
        run_sqlite(src, w1.transactions(300))
        pair.wait_caught_up()
        snapshot = pg_server.create_database()
        seq = pair.load_snapshot(snapshot, spark=spark, tables=tables)
        assert seq == pair.head()
        with psycopg.connect(replicated) as a, psycopg.connect(snapshot) as b:
            want = a.execute(wallets).fetchall()
            assert 0 < len(want) < 400  # the filter left some out
            assert b.execute(wallets).fetchall() == want
            cols = "SELECT column_name FROM information_schema.columns WHERE table_name = 'wallets'"
            assert sorted(r[0] for r in b.execute(cols)) == sorted(r[0] for r in a.execute(cols))
            assert b.execute("SELECT to_regclass('accounts')").fetchone() == (None,)
            recorded = b.execute("SELECT table_name FROM txrepl_schemas ORDER BY 1").fetchall()
            assert recorded == [("accounts",), ("orders",)]
            orders = "SELECT * FROM orders ORDER BY id"
            assert b.execute(orders).fetchall() == a.execute(orders).fetchall()
    finally:
        pair.stop()
        src.close()
