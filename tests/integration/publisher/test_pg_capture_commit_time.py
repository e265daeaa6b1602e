"""PostgreSQL capture stamps each entry with its source transaction's commit time."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from publisher.capture.postgres import Plugin
from tests.support.pg_capture import capturing, execute, open_pub, read_entries

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("plugin", ["pgoutput", "wal2json"])
def test_each_entry_carries_its_transactions_commit_time(
    pg_db: str, tmp_path: Path, plugin: Plugin
) -> None:
    """Live and from a backlog, an entry's commit time is its transaction's: after the
    transaction began on the source and before its COMMIT returned (history mode, the
    conflict resolvers and the lag stages read it)."""
    execute(pg_db, "CREATE TABLE c(id int PRIMARY KEY)")
    bounds: list[tuple[float, float]] = []

    def write(conn: psycopg.Connection[tuple[object, ...]], i: int) -> None:
        with conn.transaction():
            row = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
            conn.execute("INSERT INTO c VALUES (%s)", (i,))
        assert row is not None
        bounds.append((float(str(row[0])), time.time()))  # same host: one clock

    pub = open_pub(tmp_path, "p1", ["c"])
    with psycopg.connect(pg_db, autocommit=True) as conn:
        with capturing(pg_db, [pub], plugin=plugin) as run:
            for i in range(5):
                write(conn, i)
            run.wait_heads({"p1": 6})
        for i in range(5, 10):  # while capture is down: read back to back at the restart
            write(conn, i)
    pub.log.close()
    pub = open_pub(tmp_path, "p1", ["c"])
    with capturing(pg_db, [pub], plugin=plugin) as run:
        run.wait_heads({"p1": 11})
    entries = read_entries(pub)[1:]  # after the install snapshot's entry
    assert len(entries) == len(bounds)
    for n, (entry, (began, returned)) in enumerate(zip(entries, bounds, strict=True)):
        at = entry.commit_time_us / 1e6
        assert began - 1e-6 <= at <= returned, f"transaction {n}: {at} not in {began}..{returned}"
