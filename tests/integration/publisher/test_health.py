"""Health that tells the truth: a real publisher whose capture breaks and is repaired.

Health per component (common/health.py): ``txrepl.capture.<publication>`` and the
whole publisher (``""``) turn NOT_SERVING when capture fails in a loop, and back
to SERVING when it recovers; the same in ``/metrics`` and ``txrepl status``.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from tests.fixtures.postgres import start_pg_instance
from tests.support.harness import ROOT, Pair, wait_until
from tests.support.notify import health
from tests.support.scrape import scrape

CAPTURE = "txrepl.capture.shop"


def _statuses(address: str) -> tuple[str, str, str]:
    """(whole publisher, capture of shop, the Replication service)."""
    return (
        health(address),
        health(address, service=CAPTURE),
        health(address, service="txrepl.v1.Replication"),
    )


def _publication(address: str) -> pb.PublicationInfo:
    with grpc.insecure_channel(address) as ch:
        resp = rpc.AdminStub(ch).ListPublications(pb.ListPublicationsRequest(), timeout=10)
    (info,) = resp.publications
    return info


def _status_table(address: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "common.cli", "status", "--publisher", address, "--sample", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def test_sqlite_capture_failing_in_a_loop_is_not_serving_until_repaired(tmp_path: Path) -> None:
    """The capture table moved away: capture fails on every poll, health says
    NOT_SERVING (whole publisher and the publication's capture) with the failure in
    /metrics and `txrepl status`; moved back, SERVING again and nothing is lost."""
    pair = Pair(tmp_path, tables=["t"])
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    try:
        pub = pair.start_publisher()
        wait_until(lambda: _statuses(pub.address) == ("SERVING",) * 3, 10, "SERVING")
        src.execute("INSERT INTO t VALUES (1, 'before')")
        wait_until(lambda: pair.head() >= 2, 10, "the insert captured")
        head = pair.head()

        # Break capture: its table is renamed (the triggers follow the rename, so the
        # application's writes still succeed and are kept), every poll fails.
        src.execute("ALTER TABLE _txrepl_capture RENAME TO _txrepl_capture_aside")
        src.execute("INSERT INTO t VALUES (2, 'during')")
        wait_until(
            lambda: _statuses(pub.address) == ("NOT_SERVING", "NOT_SERVING", "SERVING"),
            30,
            "NOT_SERVING while capture fails",
        )
        m = scrape(pub.metrics_address)
        assert m[("txrepl_capture_failures_total", frozenset())] >= 3
        assert m[("txrepl_health_serving", frozenset({("service", "")}))] == 0
        assert m[("txrepl_health_serving", frozenset({("service", CAPTURE)}))] == 0
        info = _publication(pub.address)
        assert info.capture_failing
        assert "_txrepl_capture" in info.capture_error
        assert "FAILING: " in _status_table(pub.address)
        assert pair.head() == head

        # Repair: capture recovers on its next attempt, with the row written meanwhile.
        src.execute("ALTER TABLE _txrepl_capture_aside RENAME TO _txrepl_capture")
        wait_until(lambda: _statuses(pub.address) == ("SERVING",) * 3, 30, "SERVING again")
        wait_until(lambda: pair.head() == head + 1, 10, "the row written during the outage")
        m = scrape(pub.metrics_address)
        assert m[("txrepl_health_serving", frozenset({("service", "")}))] == 1
        assert m[("txrepl_capture_failures_in_a_row", frozenset())] == 0
        assert not _publication(pub.address).capture_failing
        table = _status_table(pub.address)
        assert "FAILING" not in table
        assert "CAPTURE" in table
    finally:
        pair.stop()
        src.close()


@pytest.mark.postgres
def test_postgres_source_stopped_is_not_serving_and_back_when_it_returns(
    tmp_path: Path,
) -> None:
    """The PostgreSQL instance the test started is stopped under a running publisher:
    NOT_SERVING with failures counted; started again, SERVING and capturing, and the
    slot's lag is exported."""
    with start_pg_instance() as server:
        dsn = server.create_database()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t(id int PRIMARY KEY, v text)")
        pair = Pair(tmp_path, tables=["public.t"], source_url=dsn)
        try:
            pub = pair.start_publisher()
            wait_until(lambda: _statuses(pub.address) == ("SERVING",) * 3, 30, "SERVING")
            lag_key = frozenset({("publication", "shop"), ("slot", "txrepl_pub1")})
            m = scrape(pub.metrics_address)
            assert ("txrepl_pg_slot_lag_bytes", lag_key) in m
            assert ("txrepl_pg_slot_lag_seconds", lag_key) in m

            server.stop()
            wait_until(
                lambda: _statuses(pub.address) == ("NOT_SERVING", "NOT_SERVING", "SERVING"),
                60,
                "NOT_SERVING while the source is down",
            )
            m = scrape(pub.metrics_address)
            assert m[("txrepl_capture_failures_total", frozenset())] >= 3
            assert ("txrepl_pg_slot_lag_bytes", lag_key) not in m  # unknown, not zero
            assert _publication(pub.address).capture_failing

            server.start()
            wait_until(lambda: _statuses(pub.address) == ("SERVING",) * 3, 90, "SERVING again")
            head = pair.head()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO t VALUES (1, 'after')")
            wait_until(lambda: pair.head() == head + 1, 60, "capture after the restart")
            wait_until(
                lambda: (
                    scrape(pub.metrics_address)[("txrepl_pg_slot_lag_bytes", lag_key)] < 1 << 20
                ),
                30,
                "the slot's lag known again",
            )
        finally:
            pair.stop()
