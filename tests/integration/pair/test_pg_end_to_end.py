"""PostgreSQL sources end to end: real private instances, real daemons, W1 checksums."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.support.harness import Pair, to_toml, wait_until
from tests.support.workload import (
    W1,
    W1_COLUMNS,
    diff_tables,
    pg_source,
    run_pg,
    w1_checksum,
)

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _equal(src_dsn: str, target: object) -> bool:
    with psycopg.connect(src_dsn) as src:
        try:
            return w1_checksum(src) == w1_checksum(target)
        except (sqlite3.Error, psycopg.Error):
            return False


@pytest.mark.parametrize("target_kind", ["postgres", "sqlite"])
def test_w1_from_postgresql(tmp_path: Path, pg_server, target_kind: str) -> None:
    """W1 from a PostgreSQL source (logical decoding) into PostgreSQL and SQLite: equal."""
    src_dsn = pg_server.create_database()
    src = pg_source(src_dsn)
    w1 = W1(accounts=300)
    run_pg(src, w1.transactions(1))
    if target_kind == "postgres":
        dst_dsn = pg_server.create_database()
        target_url = dst_dsn
    else:
        target_url = f"sqlite:///{tmp_path / 'target.db'}"
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders"],
        source_url=src_dsn,
        target_url=target_url,
        publisher_extra={"slot": f"txrepl_w1_{target_kind}"},  # one slot per source database
    )
    try:
        pair.start_publisher()
        run_pg(src, w1.transactions(400))  # a backlog before the subscriber exists
        pair.start_subscriber()
        run_pg(src, w1.transactions(300))  # and live traffic

        def target() -> object:
            if target_kind == "postgres":
                return psycopg.connect(dst_dsn)
            return sqlite3.connect(str(tmp_path / "target.db"))

        def equal() -> bool:
            conn = target()
            try:
                return _equal(src_dsn, conn)
            finally:
                conn.close()  # type: ignore[attr-defined]

        try:
            wait_until(equal, 180, "the target to equal the PostgreSQL source", interval=0.5)
        except TimeoutError:
            with psycopg.connect(src_dsn) as s:
                conn = target()
                raise AssertionError("\n".join(diff_tables(s, conn, W1_COLUMNS))) from None
    finally:
        pair.stop()
        src.close()


def test_source_without_logical_wal_is_a_clear_startup_error(tmp_path: Path) -> None:
    """wal_level=replica: the publisher exits with a message saying what to do, no traceback."""
    from tests.fixtures.postgres import start_pg_instance

    with start_pg_instance(wal_level="replica") as server:
        dsn = server.create_database()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE t(id int primary key)")
        cfg = {
            "server_name": "pub1",
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp_path / "publisher"),
            "source": dsn,
            "publication": [{"name": "p", "tables": ["t"]}],
        }
        path = tmp_path / "publisher.toml"
        path.write_text(to_toml(cfg))
        out = subprocess.run(
            [sys.executable, "-m", "publisher", "run", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 1
    assert "wal_level" in out.stderr
    assert "logical" in out.stderr
    assert "Traceback" not in out.stderr


def test_w1_from_sqlite_into_postgresql(tmp_path: Path, pg_server) -> None:
    """W1 from the embedded SQLite source into PostgreSQL: exact types, equal checksums."""
    from tests.support.workload import run_sqlite, sqlite_source

    dst_dsn = pg_server.create_database()
    pair = Pair(tmp_path, tables=["accounts", "orders"], target_url=dst_dsn)
    src = sqlite_source(pair.source_path)
    w1 = W1(accounts=300)
    run_sqlite(src, w1.transactions(401))
    try:
        pair.start_publisher()
        pair.start_subscriber()
        run_sqlite(src, w1.transactions(300))

        def equal() -> bool:
            with psycopg.connect(dst_dsn) as dst:
                try:
                    return w1_checksum(src) == w1_checksum(dst)
                except psycopg.Error:
                    return False

        try:
            wait_until(equal, 180, "PostgreSQL to equal the SQLite source", interval=0.5)
        except TimeoutError:
            with psycopg.connect(dst_dsn) as dst:
                raise AssertionError("\n".join(diff_tables(src, dst, W1_COLUMNS))) from None
        with psycopg.connect(dst_dsn) as dst:
            row = dst.execute(
                "SELECT data_type FROM information_schema.columns "
                "WHERE table_name = 'orders' AND column_name = 'amount'"
            ).fetchone()
        assert row == ("numeric",)
    finally:
        pair.stop()
