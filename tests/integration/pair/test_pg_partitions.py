"""A partitioned PostgreSQL table published by its parent (issue 19), through the real
daemons: the rows of every partition arrive, including updates that move a row from
one partition to another, into a plain or a partitioned PostgreSQL table and into
SQLite."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from publisher.capture.postgres import PostgresCapture
from publisher.errors import SourceError
from tests.support.harness import Pair
from tests.support.phases import backlog_live_reinit, settle

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

DDL = [
    "CREATE TABLE events (id bigint, region text NOT NULL, note text,"
    " PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
    "CREATE TABLE events_eu PARTITION OF events FOR VALUES IN ('eu')",
    "CREATE TABLE events_us PARTITION OF events FOR VALUES IN ('us')",
    "CREATE TABLE events_rest PARTITION OF events DEFAULT",
]
REGIONS = ["eu", "us", "ap"]
ROWS = "SELECT id, region, note FROM events ORDER BY id, region"


def _work(conn: psycopg.Connection[Any], start: int, n: int) -> None:
    """``n`` transactions: inserts into every partition, updates in place, rows moved
    to another partition, deletes."""
    for i in range(start, start + n):
        with conn.transaction():
            conn.execute("INSERT INTO events VALUES (%s, %s, %s)", (i, REGIONS[i % 3], f"note {i}"))
            conn.execute("UPDATE events SET note = note || '+' WHERE id %% 4 = %s", (i % 4,))
            if i % 3 == 0:  # moves the row to the next region's partition
                conn.execute(
                    "UPDATE events SET region = CASE region WHEN 'eu' THEN 'us'"
                    " WHEN 'us' THEN 'ap' ELSE 'eu' END WHERE id = %s",
                    (i - 1,),
                )
            if i % 5 == 0:
                conn.execute("DELETE FROM events WHERE id = %s", (i - 3,))


@pytest.mark.parametrize("target", ["postgres-plain", "postgres-partitioned", "sqlite"])
def test_a_partitioned_table_replicates_by_its_parent(
    tmp_path: Path, pg_server: Any, spark: Any, target: str
) -> None:
    """Publishing ``events`` (three partitions) carries the rows of every partition,
    rows moved between partitions included, row for row: rows present at install, a
    backlog in one batch, live small batches, and a reinit's snapshot; also when the
    PostgreSQL publication predates partition support (made without
    ``publish_via_partition_root``)."""
    src_url = pg_server.create_database()
    src = psycopg.connect(src_url, autocommit=True)
    for stmt in DDL:
        src.execute(stmt)
    made: list[str] = []

    def target_url() -> str:
        made.append(str(pg_server.create_database()) if target != "sqlite" else "")
        if made[-1] and target == "postgres-partitioned":
            with psycopg.connect(made[-1], autocommit=True) as dst:
                for stmt in DDL:
                    dst.execute(stmt)
        return made[-1] or f"sqlite:///{tmp_path / f'target{len(made)}.db'}"

    def differences(url: str) -> list[str]:
        ours = [tuple(r) for r in src.execute(ROWS).fetchall()]
        try:
            if url.startswith("sqlite"):
                with sqlite3.connect(url.removeprefix("sqlite:///")) as lite:
                    theirs = [tuple(r) for r in lite.execute(ROWS).fetchall()]
            else:
                with psycopg.connect(url, autocommit=True) as dst:
                    theirs = [tuple(r) for r in dst.execute(ROWS).fetchall()]
        except (sqlite3.Error, psycopg.Error) as e:
            return [str(e).strip()]
        missing = sorted(set(ours) - set(theirs))[:5]
        extra = sorted(set(theirs) - set(ours))[:5]
        return [] if ours == theirs else [f"missing {missing}, extra {extra}"]

    _work(src, 0, 12)  # present when the table is added
    dst_url = target_url()
    slot = "txrepl_" + src_url.rsplit("/", 1)[-1]
    if target == "postgres-plain":  # a PostgreSQL publication made by an older txrepl
        src.execute(
            f"CREATE PUBLICATION txrepl_{slot} WITH (publish = 'insert, update, delete, truncate')"
        )
    pair = Pair(
        tmp_path,
        tables=["events"],
        source_url=src_url,
        target_url=dst_url,
        publisher_extra={"slot": slot},
    )

    try:
        backlog_live_reinit(pair, lambda i, n: _work(src, i, n), differences, target_url, spark, 12)
    finally:
        src.close()


def test_a_partitioned_table_is_refused_under_wal2json(pg_db: str) -> None:
    """wal2json names partitions, not their table: publishing a partitioned table
    under it is refused when added, naming the table and the plugin to use; nothing
    is installed."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for stmt in DDL:
            conn.execute(stmt)
    cap = PostgresCapture(pg_db, slot="s_parts_w2j", plugin="wal2json")
    try:
        with pytest.raises(SourceError, match=r"'events' is partitioned.*pgoutput"):
            cap.install("p", "inc", ["events"])
    finally:
        cap.close()


def test_a_partition_created_while_running_replicates(tmp_path: Path, pg_server: Any) -> None:
    """A partition created and another attached while both daemons run (no restart):
    rows routed into them arrive, and so do updates that leave a TOASTed value
    unchanged there (the new partitions lack FULL identity: the table is copied
    instead of capture stopping)."""
    src_url = pg_server.create_database()
    dst_url = pg_server.create_database()
    src = psycopg.connect(src_url, autocommit=True)
    src.execute(
        "CREATE TABLE docs (id int, region text, note text, body text,"
        " PRIMARY KEY (id, region)) PARTITION BY LIST (region)"
    )
    src.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")  # TOASTed
    src.execute("CREATE TABLE docs_eu PARTITION OF docs FOR VALUES IN ('eu')")
    big = "x" * 4000  # over the TOAST threshold, stored out of line
    src.execute("INSERT INTO docs VALUES (1, 'eu', 'a', %s)", (big,))
    rows = "SELECT id, region, note, md5(body) FROM docs ORDER BY id, region"

    def differences() -> list[str]:
        want = src.execute(rows).fetchall()
        try:
            with psycopg.connect(dst_url, autocommit=True) as dst:
                have = dst.execute(rows).fetchall()
        except psycopg.Error as e:
            return [str(e).strip()]
        return [] if have == want else [f"source {want}, target {have}"]

    pair = Pair(
        tmp_path,
        tables=["docs"],
        source_url=src_url,
        target_url=dst_url,
        publisher_extra={"slot": "txrepl_" + src_url.rsplit("/", 1)[-1]},
    )
    try:
        pair.start_publisher()
        pair.start_subscriber()
        settle(pair, differences)
        src.execute("CREATE TABLE docs_us PARTITION OF docs FOR VALUES IN ('us')")
        src.execute("CREATE TABLE docs_ap (LIKE docs)")
        src.execute("ALTER TABLE docs ATTACH PARTITION docs_ap FOR VALUES IN ('ap')")
        for i, region in enumerate(["us", "ap", "eu"], start=2):
            src.execute("INSERT INTO docs VALUES (%s, %s, 'a', %s)", (i, region, big + region))
        settle(pair, differences)
        with src.transaction():  # the body is left unchanged: in no image of the new ones
            src.execute("UPDATE docs SET note = 'b'")
            src.execute("INSERT INTO docs VALUES (5, 'us', 'c', 'small')")
        src.execute("UPDATE docs SET note = note || '!' WHERE region = 'ap'")
        settle(pair, differences)
    finally:
        pair.stop()
        src.close()
