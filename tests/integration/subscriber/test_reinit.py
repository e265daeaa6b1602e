"""Re-initialisation from a consistent snapshot, and new subscribers after a purge."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import ClientTls, client_channel, hash_token
from tests.support.certs import make_certs
from tests.support.feedclient import RawSubscriber
from tests.support.harness import Pair, wait_until
from tests.support.ledger import (
    LEDGER_COLUMNS,
    ledger_source,
    ledger_txns,
    wait_equal,
)

pytestmark = pytest.mark.spark


def bursts(src: sqlite3.Connection, start: int, n: int, size: int = 10) -> int:
    """``n`` bursts of ``size`` transactions, apart enough to become separate entries."""
    for i in range(n):
        ledger_txns(src, start + i * size, size)
        time.sleep(0.03)
    return start + n * size


def test_invalid_by_max_delta_then_reinit_then_valid_and_converges(tmp_path: Path) -> None:
    """max_delta exceeded → invalid → `txrepl subscriber reinit` → valid → target = source."""
    pair = Pair(tmp_path, tables=["counter", "ledger"], publication_extra={"max_delta": 8})
    src = ledger_source(pair.source_path)
    try:
        pair.start_publisher()
        # Connect first: the bursts may log up to one entry per transaction, and a
        # first Hello more than max_delta behind would already be refused.
        sub = pair.start_subscriber()
        nxt = bursts(src, 1, 2)
        level = pair.wait_caught_up(timeout=120)
        sub.stop()
        # More than max_delta entries behind; capture may fold bursts into one entry.
        nxt = bursts(src, nxt, 12)
        deadline = time.monotonic() + 60
        while pair.head() - level <= 8:
            assert time.monotonic() < deadline, "capture made no entries"
            nxt = bursts(src, nxt, 3)
        sub = pair.start_subscriber()
        wait_until(lambda: pair.status().state == "invalid", 60, "the subscriber to be invalid")
        assert "max_delta" in pair.status().last_error
        # Concurrent reader: the ledger table is never seen half loaded.
        counts: list[int] = []
        stop = threading.Event()

        def reader() -> None:
            conn = sqlite3.connect(str(pair.target_path), timeout=30)
            while not stop.is_set():
                try:
                    counts.append(conn.execute("SELECT count(*) FROM ledger").fetchone()[0])
                except sqlite3.OperationalError:
                    pass  # the swap's moment: the table is being replaced
                time.sleep(0.005)
            conn.close()

        before = (
            sqlite3.connect(str(pair.target_path))
            .execute("SELECT count(*) FROM ledger")
            .fetchone()[0]
        )
        t = threading.Thread(target=reader)
        t.start()
        out = subprocess.run(
            pair.reinit_argv(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        stop.set()
        t.join()
        assert out.returncode == 0, out.stdout + out.stderr
        assert "marked sub1 valid" in out.stdout
        after = (
            sqlite3.connect(str(pair.target_path))
            .execute("SELECT count(*) FROM ledger")
            .fetchone()[0]
        )
        assert set(counts) <= {before, after}, sorted(set(counts))
        bursts(src, nxt, 2)
        wait_equal(src, pair.target_path, LEDGER_COLUMNS)
        wait_until(lambda: pair.status().state == "in_sync", 60, "in sync after reinit")
    finally:
        pair.stop()


def test_reinit_cli_authenticates_with_the_subscriptions_token_file(tmp_path: Path) -> None:
    """`txrepl subscriber reinit` sends the token of the subscription's ``token_file``
    (the daemon's snapshot loader does; the command used to send none and was refused)."""
    token = "sub1-secret-token"
    token_file = tmp_path / "sub1.token"
    token_file.write_text(token + "\n")
    pair = Pair(
        tmp_path,
        tables=["counter", "ledger"],
        publisher_extra={
            "auth": {"admin_token_hashes": [hash_token("admin-secret-token")]},
            "subscriber": [
                {"name": "sub1", "token_hash": hash_token(token), "publications": ["shop"]}
            ],
        },
        subscription_extra={"token_file": str(token_file)},
    )
    src = ledger_source(pair.source_path)
    try:
        pub = pair.start_publisher()
        ledger_txns(src, 1, 20)
        pair.write_subscriber_config(pub.address)  # no daemon: the command loads alone
        out = subprocess.run(
            [*pair.reinit_argv(), "--no-mark-valid"], capture_output=True, text=True, timeout=180
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "loaded snapshot of 'shop'" in out.stdout
        wait_equal(src, pair.target_path, LEDGER_COLUMNS, timeout=10)
    finally:
        pair.stop()
        src.close()


def test_new_subscriber_after_purge_starts_from_a_snapshot(tmp_path: Path) -> None:
    """Early segments purged (a fast subscriber acked them): a new subscriber converges."""
    pair = Pair(
        tmp_path,
        tables=["counter", "ledger"],
        publisher_extra={"retention_interval_s": 0.2, "log": {"segment_bytes": 4096}},
    )
    src = ledger_source(pair.source_path)
    try:
        pub = pair.start_publisher()
        nxt = bursts(src, 1, 30)

        fast = RawSubscriber(pub.address, "fast")  # resumes from where it got to

        async def fast_reader() -> None:
            sub = RawSubscriber(
                pub.address,
                "fast",
                level=fast.level,
                incarnation=fast.incarnation,
                target=fast.target,
            )
            await sub.start()
            await sub.wait_level(pair.head(), 60)
            fast.level, fast.incarnation = sub.level, sub.incarnation
            await sub.close()

        def purged() -> bool:
            # On a loaded machine capture may fold the bursts into a few large entries
            # that fit the active segment: then write and ack more until one rolls.
            nonlocal nxt
            if pair.status_publications()["shop"].first_retained > 1:
                return True
            nxt = bursts(src, nxt, 3)
            asyncio.run(fast_reader())
            time.sleep(0.5)  # two retention passes
            return pair.status_publications()["shop"].first_retained > 1

        asyncio.run(fast_reader())
        wait_until(purged, 90, "a purge")
        pair.start_subscriber()  # sub1: new, level 0, initial = "auto"
        wait_equal(src, pair.target_path, LEDGER_COLUMNS)
        bursts(src, nxt, 2)
        wait_equal(src, pair.target_path, LEDGER_COLUMNS)
        reasons = " ".join(t.reason for t in pair.status().timeline)
        assert "snapshot" in reasons
    finally:
        pair.stop()


def _entries(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(str(path))
    try:
        rows = conn.execute("SELECT id, txn, amount, memo, cents FROM entries ORDER BY id")
        return [(i, t, float(a), m, c) for i, t, a, m, c in rows]  # amounts: text here
    finally:
        conn.close()


def test_reinit_loads_a_transformed_table_as_the_apply_shapes_it(tmp_path: Path) -> None:
    """A table with transforms (another target name, a rename, a computed column, a
    filter) is loaded by reinit into exactly what replication had built there; the
    subscription then goes on applying into it."""
    shaping = {
        "apply": {
            "tables": {
                "ledger": {
                    "target": "entries",
                    "rename": {"note": "memo"},
                    "computed": {"cents": "CAST(CAST(amount AS DECIMAL(12,2)) * 100 AS BIGINT)"},
                    "filter": "txn % 3 <> 0",
                }
            }
        }
    }
    pair = Pair(tmp_path, tables=["counter", "ledger"], subscriber_extra=shaping)
    src = ledger_source(pair.source_path)

    def expected() -> list[tuple[object, ...]]:
        rows = src.execute("SELECT id, txn, amount, note FROM ledger ORDER BY id").fetchall()
        return [(i, t, a, n, round(float(a) * 100)) for i, t, a, n in rows if int(t) % 3 != 0]

    try:
        pair.start_publisher()
        sub = pair.start_subscriber()
        nxt = bursts(src, 1, 3)
        pair.wait_caught_up()
        sub.stop()
        replicated = _entries(pair.target_path)
        assert replicated == expected()
        assert len(replicated) > 10
        conn = sqlite3.connect(str(pair.target_path))
        conn.execute("DELETE FROM entries")  # lost: only a reinit brings them back
        conn.commit()
        conn.close()
        out = subprocess.run(pair.reinit_argv(), capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
        assert _entries(pair.target_path) == replicated
        conn = sqlite3.connect(str(pair.target_path))
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        conn.close()
        assert "ledger" not in tables
        assert not [t for t in tables if "shadow" in t]
        pair.start_subscriber()
        bursts(src, nxt, 2)
        wait_until(lambda: _entries(pair.target_path) == expected(), 60, "entries = source")
    finally:
        pair.stop()


def test_snapshot_of_a_history_table_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """History mode: `reinit` fails naming the table, the target is byte-for-byte as
    before, and a new subscription that must start from a snapshot stops in state
    error."""
    shaping = {"apply": {"tables": {"counter": {"history": True}}}}
    pair = Pair(tmp_path / "a", tables=["counter", "ledger"], subscriber_extra=shaping)
    pair.workdir.mkdir()
    src = ledger_source(pair.source_path)
    try:
        pair.start_publisher()
        sub = pair.start_subscriber()
        bursts(src, 1, 3)
        pair.wait_caught_up()
        sub.stop()
        conn = sqlite3.connect(str(pair.target_path))
        assert conn.execute("SELECT count(*) FROM counter").fetchone()[0] > 1  # versions
        before = list(conn.iterdump())
        conn.close()
        out = subprocess.run(pair.reinit_argv(), capture_output=True, text=True, timeout=180)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "[apply.tables.counter] sets history" in out.stderr
        assert "nothing was loaded" in out.stderr
        conn = sqlite3.connect(str(pair.target_path))
        assert list(conn.iterdump()) == before
        conn.close()

        fresh = Pair(
            tmp_path / "b",
            tables=["counter", "ledger"],
            subscriber_extra=shaping,
            subscription_extra={"initial": "snapshot"},
        )
        fresh.workdir.mkdir()
        fresh.pub = pair.pub
        try:
            fresh.start_subscriber()
            wait_until(lambda: fresh.status().state == "error", 120, "state error")
            assert "[apply.tables.counter] sets history" in fresh.status().last_error
            conn = sqlite3.connect(str(fresh.target_path))
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            conn.close()
            assert not {"ledger", "counter"} & tables
            assert not [t for t in tables if t.startswith("txrepl_shadow__")]
        finally:
            if fresh.sub is not None:
                fresh.sub.stop()
    finally:
        pair.stop()


def test_sqlite_reinit_carries_indexes_and_triggers_over(tmp_path: Path, spark: Any) -> None:
    """Indexes and triggers made on a replicated SQLite table survive a reinit; one
    that cannot be re-created fails it by name and changes nothing."""
    from subscriber.reinit import SnapshotError

    pair = Pair(tmp_path, tables=["counter", "ledger"])
    src = ledger_source(pair.source_path)
    made = (
        "SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'ledger'"
        " AND sql IS NOT NULL AND type <> 'table' ORDER BY 1, 2"
    )

    def load() -> int:
        return pair.load_snapshot(pair.target_path, spark=spark)

    try:
        pair.start_publisher()
        nxt = bursts(src, 1, 2)
        wait_until(lambda: pair.head() > 0, 60, "entries")
        load()
        dst = sqlite3.connect(str(pair.target_path), isolation_level=None)
        dst.executescript(
            """
            CREATE INDEX ledger_by_txn ON ledger (txn);
            CREATE TABLE audit (id INTEGER);
            CREATE TRIGGER ledger_audit AFTER INSERT ON ledger BEGIN
              INSERT INTO audit VALUES (new.id);
            END;
            """
        )
        before = dst.execute(made).fetchall()
        assert [r[1] for r in before] == ["ledger_by_txn", "ledger_audit"]
        head = pair.head()
        bursts(src, nxt, 2)
        wait_until(lambda: pair.head() > head, 60, "more entries")
        level = load()
        assert dst.execute(made).fetchall() == before
        dst.execute("INSERT INTO ledger (id, txn, amount, note) VALUES (-1, 0, '1.00', 'x')")
        assert dst.execute("SELECT id FROM audit").fetchall() == [(-1,)]  # the trigger fires
        dst.execute("DELETE FROM ledger WHERE id = -1")

        dst.execute("ALTER TABLE ledger ADD COLUMN extra INTEGER")
        dst.execute("CREATE INDEX ledger_extra ON ledger (extra)")
        content = list(dst.iterdump())
        with pytest.raises(SnapshotError, match="index 'ledger_extra' of 'ledger'"):
            load()
        assert list(dst.iterdump()) == content
        row = dst.execute("SELECT level FROM txrepl_subscriptions").fetchone()
        assert row == (level,)
        dst.close()
    finally:
        pair.stop()


def test_snapshot_and_reinit_over_mutual_tls_with_token_files(tmp_path: Path) -> None:
    """A publisher with TLS, client certificates and tokens: a new subscriber whose
    subscription says initial = "snapshot" loads its first snapshot over mutual TLS
    with its token_file, and `txrepl subscriber reinit` (the subscription's TLS and
    token_file, the admin token from --admin-token-file) reloads it and marks it
    valid; both used to open plaintext channels, which the TLS port refuses."""
    certs = make_certs(tmp_path / "certs")
    token_file = tmp_path / "sub1.token"
    token_file.write_text("sub1-tls-token-0123456789\n")
    admin_file = tmp_path / "admin.token"
    admin_file.write_text("admin-tls-token-0123456789\n")
    pair = Pair(
        tmp_path,
        tables=["counter", "ledger"],
        publisher_extra={
            "tls": {
                "cert_file": str(certs.server_cert),
                "key_file": str(certs.server_key),
                "client_ca_file": str(certs.ca),
            },
            "auth": {"admin_token_hashes": [hash_token("admin-tls-token-0123456789")]},
            "subscriber": [
                {
                    "name": "sub1",
                    "token_hash": hash_token("sub1-tls-token-0123456789"),
                    "publications": ["shop"],
                }
            ],
        },
        # The subscriber's control port speaks TLS and wants its own admin token.
        subscriber_extra={
            "auth": {"admin_token_hashes": [hash_token("control-token-0123456789")]},
            "tls": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)},
        },
        subscription_extra={
            "ca_file": str(certs.ca),
            "cert_file": str(certs.client_cert),
            "key_file": str(certs.client_key),
            "token_file": str(token_file),
            "initial": "snapshot",
        },
    )
    control_file = tmp_path / "control.token"
    control_file.write_text("control-token-0123456789\n")
    src = ledger_source(pair.source_path)

    def timeline() -> str:
        assert pair.sub is not None
        with client_channel(pair.sub.address, ClientTls(ca_file=str(certs.ca))) as ch:
            resp = rpc.SubscriberControlStub(ch).Status(
                pb.StatusRequest(),
                timeout=10,
                metadata=(("x-txrepl-token", "control-token-0123456789"),),
            )
        return " ".join(f"{t.state}:{t.reason}" for t in resp.subscriptions[0].timeline)

    try:
        pair.start_publisher()
        nxt = bursts(src, 1, 3)
        pair.start_subscriber()
        wait_equal(src, pair.target_path, LEDGER_COLUMNS)
        assert "loading a snapshot" in timeline()
        reinit = [*pair.reinit_argv(), "--admin-token-file", str(admin_file)]
        # A daemon that cannot be paused (its TLS not trusted, then no control token)
        # stops the command: nothing is loaded.  It used to carry on as if none ran.
        for extra, why in (
            ([], "UNAVAILABLE"),
            (["--control-ca", str(certs.ca)], "UNAUTHENTICATED"),
        ):
            refused = subprocess.run([*reinit, *extra], capture_output=True, text=True, timeout=180)
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert "cannot pause pub1.shop" in refused.stderr
            assert why in refused.stderr
            assert "loaded snapshot" not in refused.stdout
        assert timeline().count("loading a snapshot") == 1
        assert "paused" not in timeline()
        reinit += ["--control-ca", str(certs.ca)]
        out = subprocess.run(
            [*reinit, "--control-token-file", str(control_file)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "loaded snapshot of 'shop'" in out.stdout
        assert "marked sub1 valid" in out.stdout
        assert "resumed pub1.shop" in out.stdout
        bursts(src, nxt, 2)
        wait_equal(src, pair.target_path, LEDGER_COLUMNS)
    finally:
        pair.stop()
        src.close()


def test_reinit_with_an_unreadable_token_file_is_one_line_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """A missing --admin-token-file, or a subscription token_file that is empty: one
    line naming the key, exit 3 (an unreadable file: common/exits.py), no traceback,
    no target written."""
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    pair = Pair(tmp_path, tables=["t"])
    pair.write_subscriber_config("127.0.0.1:1")
    out = subprocess.run(
        [*pair.reinit_argv(), "--admin-token-file", str(tmp_path / "missing.token")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "--admin-token-file '" in out.stderr
    assert "missing.token': cannot read the token" in out.stderr
    pair.subscription_extra = {"token_file": str(empty)}
    pair.write_subscriber_config("127.0.0.1:1")
    out = subprocess.run(pair.reinit_argv(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "subscription pub1.shop: token_file '" in out.stderr
    assert "': the file is empty" in out.stderr
    assert not pair.target_path.exists()
