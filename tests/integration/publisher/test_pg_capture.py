"""Log-based capture from a private PostgreSQL: values, transactions, snapshots, schema."""

from __future__ import annotations

import datetime as dt
import decimal
import time
from pathlib import Path

import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres import Plugin, PostgresCapture
from publisher.errors import SourceError
from tests.fixtures.postgres import start_pg_instance
from tests.support.pg_capture import (
    capturing,
    execute,
    open_pub,
    read_entries,
    row_ops,
    wait_for,
)

pytestmark = pytest.mark.postgres

ALL_TYPES = """
CREATE TABLE alltypes(
    id bigint PRIMARY KEY, i2 smallint, i4 integer, n numeric(12,3), nu numeric,
    f8 double precision, t text, vc varchar(10), b bytea, ok boolean, d date, tm time,
    ts timestamp, tz timestamptz, j json, jb jsonb, big text)
"""

ROW1 = (
    "INSERT INTO alltypes VALUES (1, -32768, 2147483647, 123456789.120, 0.1000000000000000001,"
    " 0.1, 'héllo ''q''', 'abc', '\\x00ff10', true, '2024-02-29', '23:59:59.999999',"
    " '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.5+02', '{\"a\": [1, 2.50]}',"
    " '{\"b\": null}', NULL)"
)

EXPECTED_ROW1 = [
    1,
    -32768,
    2147483647,
    decimal.Decimal("123456789.120"),
    decimal.Decimal("0.1000000000000000001"),
    0.1,
    "héllo 'q'",
    "abc",
    b"\x00\xff\x10",
    True,
    dt.date(2024, 2, 29),
    dt.time(23, 59, 59, 999999),
    dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
    dt.datetime(2024, 1, 2, 1, 4, 5, 500000, tzinfo=dt.UTC),
    '{"a": [1, 2.50]}',
    '{"b": null}',
    None,
]


# wal2json refuses the numeric and double precision columns of ALL_TYPES (it writes NaN
# as null); tests/integration/pair/test_pg_types.py runs every other type through it.
@pytest.mark.parametrize("plugin", ["pgoutput"])
def test_dml_of_every_type_is_captured_exactly(pg_db: str, tmp_path: Path, plugin: Plugin) -> None:
    """Inserts, updates, key changes, deletes and truncate arrive with exact values."""
    execute(pg_db, ALL_TYPES)
    pub = open_pub(tmp_path, "p1", ["alltypes"])
    # A TOASTed value big and random enough to be stored out of line, then left unchanged.
    big = "md5(random()::text) || " * 0
    with capturing(pg_db, [pub], plugin=plugin) as run:
        run.wait_heads({"p1": 1})  # the snapshot: schema + truncate of the empty table
        execute(pg_db, ROW1)
        execute(
            pg_db,
            "UPDATE alltypes SET big = (SELECT string_agg(md5(g::text || random()::text), '')"
            " FROM generate_series(1, 4000) g) WHERE id = 1",
        )
        execute(pg_db, "UPDATE alltypes SET n = -0.5, t = NULL WHERE id = 1")
        execute(pg_db, "UPDATE alltypes SET id = 2 WHERE id = 1")
        execute(pg_db, "DELETE FROM alltypes WHERE id = 2")
        execute(pg_db, ROW1, "TRUNCATE alltypes")
        run.wait_heads({"p1": 7})
    del big
    entries = read_entries(pub)
    assert len(entries) == 7
    schema = entries[0].ops[0].schema
    assert [(c.name, pb.ColumnType.Name(c.type), c.precision, c.scale) for c in schema.columns][
        :6
    ] == [
        ("id", "COLUMN_TYPE_INTEGER", 0, 0),
        ("i2", "COLUMN_TYPE_INTEGER", 0, 0),
        ("i4", "COLUMN_TYPE_INTEGER", 0, 0),
        ("n", "COLUMN_TYPE_DECIMAL", 12, 3),
        ("nu", "COLUMN_TYPE_DECIMAL", 0, 0),
        ("f8", "COLUMN_TYPE_FLOAT", 0, 0),
    ]
    assert [pb.ColumnType.Name(c.type) for c in schema.columns][6:] == [
        "COLUMN_TYPE_TEXT",
        "COLUMN_TYPE_TEXT",
        "COLUMN_TYPE_BYTES",
        "COLUMN_TYPE_BOOLEAN",
        "COLUMN_TYPE_DATE",
        "COLUMN_TYPE_TIME",
        "COLUMN_TYPE_TIMESTAMP",
        "COLUMN_TYPE_TIMESTAMPTZ",
        "COLUMN_TYPE_JSON",
        "COLUMN_TYPE_JSON",
        "COLUMN_TYPE_TEXT",
    ]
    assert list(schema.primary_key) == ["id"]
    assert schema.columns[0].nullable is False
    assert schema.columns[1].nullable is True
    assert schema.columns[3].source_type == "numeric(12,3)"
    ops = row_ops(entries)
    assert ops[0] == ("alltypes", "TRUNCATE", [], [])
    assert ops[1] == ("alltypes", "INSERT", [], EXPECTED_ROW1)
    # the TOASTed value: written once, then carried whole although the update left it alone
    assert ops[2][1] == "UPDATE"
    assert ops[2][2] == [1]
    big_value = ops[2][3][-1]
    assert isinstance(big_value, str)
    assert len(big_value) == 128_000
    changed = list(EXPECTED_ROW1)
    changed[3], changed[6], changed[-1] = decimal.Decimal("-0.500"), None, big_value
    assert ops[3] == ("alltypes", "UPDATE", [1], changed)
    assert ops[4] == ("alltypes", "UPDATE", [1], [2, *changed[1:]])  # key change: old key
    assert ops[5] == ("alltypes", "DELETE", [2], [])
    assert ops[6:] == [("alltypes", "INSERT", [], EXPECTED_ROW1), ("alltypes", "TRUNCATE", [], [])]
    # one entry per source transaction, at its commit LSN, in commit order
    positions = [int(e.source_position) for e in entries]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)
    assert all(len(e.ops) == 1 for e in entries[2:6])


def test_existing_rows_arrive_before_streamed_changes(pg_db: str, tmp_path: Path) -> None:
    """A table's current rows come from the snapshot, then only later changes are streamed."""
    execute(
        pg_db,
        "CREATE TABLE acc(id int PRIMARY KEY, bal numeric(10,2) NOT NULL)",
        "INSERT INTO acc SELECT g, g * 1.5 FROM generate_series(1, 2500) g",
    )
    pub = open_pub(tmp_path, "p1", ["acc"])
    with capturing(pg_db, [pub], snapshot_chunk_rows=1000) as run:
        execute(pg_db, "UPDATE acc SET bal = 0 WHERE id = 1")
        run.wait_heads({"p1": 4})
    entries = read_entries(pub)
    assert len(entries) == 4  # 2500 rows + schema + truncate in chunks of 1000 ops, then 1 txn
    ops = row_ops(entries)
    inserted = {r[3][0]: r[3][1] for r in ops if r[1] == "INSERT"}
    assert len(inserted) == 2500
    assert inserted[7] == decimal.Decimal("10.50")
    assert ops[-1] == ("acc", "UPDATE", [1], [1, decimal.Decimal("0.00")])
    snap_positions = [int(e.source_position) for e in entries[:3]]
    assert snap_positions[0] == snap_positions[1] == snap_positions[2] - 1
    assert int(entries[3].source_position) > snap_positions[2]


def test_transaction_touching_two_publications(pg_db: str, tmp_path: Path) -> None:
    """One source transaction makes one entry in each publication it touches."""
    execute(
        pg_db,
        "CREATE TABLE a(id int PRIMARY KEY, v text)",
        "CREATE TABLE b(id int PRIMARY KEY, v text)",
        "CREATE TABLE c(id int PRIMARY KEY, v text)",
    )
    p1 = open_pub(tmp_path, "p1", ["a", "c"])
    p2 = open_pub(tmp_path, "p2", ["b", "c"])
    with capturing(pg_db, [p1, p2]) as run:
        run.wait_heads({"p1": 2, "p2": 2})  # one snapshot entry per table
        execute(
            pg_db,
            "INSERT INTO a VALUES (1, 'a1')",
            "INSERT INTO b VALUES (1, 'b1')",
            "INSERT INTO c VALUES (1, 'c1')",
            "INSERT INTO a VALUES (2, 'a2')",
        )
        execute(pg_db, "INSERT INTO b VALUES (2, 'b2')")
        run.wait_heads({"p1": 3, "p2": 4})
    e1, e2 = read_entries(p1)[2:], read_entries(p2)[2:]
    assert len(e1) == 1
    assert len(e2) == 2
    assert [(t, v) for t, _, _, v in row_ops(e1)] == [
        ("a", [1, "a1"]),
        ("c", [1, "c1"]),
        ("a", [2, "a2"]),
    ]
    assert [(t, v) for t, _, _, v in row_ops(e2[:1])] == [("b", [1, "b1"]), ("c", [1, "c1"])]
    assert e1[0].source_position == e2[0].source_position  # the same commit LSN
    assert row_ops(e2[1:]) == [("b", "INSERT", [], [2, "b2"])]


@pytest.mark.parametrize("plugin", ["pgoutput", "wal2json"])
def test_add_column_mid_stream(pg_db: str, tmp_path: Path, plugin: Plugin) -> None:
    """ALTER TABLE ADD/DROP/retype: a schema op precedes the first row that needs it; an
    ADD COLUMN with a default and a type change are followed by a copy of the table."""
    execute(pg_db, "CREATE TABLE s(id int PRIMARY KEY, a text)")
    pub = open_pub(tmp_path, "p1", ["s"])
    with capturing(pg_db, [pub], plugin=plugin) as run:
        run.wait_heads({"p1": 1})
        execute(pg_db, "INSERT INTO s VALUES (1, 'before')")
        execute(pg_db, "ALTER TABLE s ADD COLUMN n numeric(5,1) DEFAULT 2.5")
        execute(pg_db, "INSERT INTO s VALUES (2, 'after', 7.25)")
        execute(pg_db, "UPDATE s SET a = 'again' WHERE id = 1")
        execute(pg_db, "ALTER TABLE s DROP COLUMN a", "ALTER TABLE s ALTER n TYPE bigint")
        execute(pg_db, "INSERT INTO s VALUES (3, 9)")
        run.wait_heads({"p1": 6})

        def copies() -> list[pb.Entry]:
            # the copies (schema, truncate, rows: publisher/capture/postgres/_evolve.py)
            # land where the stream reaches their snapshot (one may be retaken after the
            # rewrite, or serve both changes); the changes keep their order around them
            return [
                e
                for e in read_entries(pub)[1:]
                if any(op.row.op == pb.ROW_OP_TRUNCATE for op in e.ops)
            ]

        def final_copy() -> bool:
            last = copies()[-1:]
            rows = sorted(r[3] for r in row_ops(last) if r[1] == "INSERT")  # heap order
            return rows == [[1, 3], [2, 7], [3, 9]]

        wait_for(final_copy, 30, "a copy of the table after the type change")
    copied = copies()
    entries = [e for e in read_entries(pub) if e not in copied]
    kinds = [[op.WhichOneof("kind") for op in e.ops] for e in entries[1:]]
    assert kinds == [["row"], ["schema", "row"], ["row"], ["schema", "row"]]
    s2 = entries[2].ops[0].schema
    assert [(c.name, c.precision, c.scale) for c in s2.columns] == [
        ("id", 0, 0),
        ("a", 0, 0),
        ("n", 5, 1),
    ]
    s3 = entries[4].ops[0].schema
    assert [(c.name, pb.ColumnType.Name(c.type)) for c in s3.columns] == [
        ("id", "COLUMN_TYPE_INTEGER"),
        ("n", "COLUMN_TYPE_INTEGER"),
    ]
    assert [r[3] for r in row_ops(entries[1:])] == [
        [1, "before"],
        [2, "after", decimal.Decimal("7.3")],  # numeric(5,1) rounds on the source
        [1, "again", decimal.Decimal("2.5")],
        [3, 9],
    ]


def test_restart_resumes_without_loss_or_duplicates(pg_db: str, tmp_path: Path) -> None:
    """Stop, write more, restart: every transaction appears exactly once, in order."""
    execute(pg_db, "CREATE TABLE r(id int PRIMARY KEY, v int)")
    pub = open_pub(tmp_path, "p1", ["r"])
    with capturing(pg_db, [pub]) as run:
        for i in range(20):
            execute(pg_db, f"INSERT INTO r VALUES ({i}, {i})")
        run.wait_heads({"p1": 21})
    for i in range(20, 40):  # written while the publisher is down
        execute(pg_db, f"INSERT INTO r VALUES ({i}, {i})")
    pub.log.close()
    pub = open_pub(tmp_path, "p1", ["r"])
    with capturing(pg_db, [pub]) as run:
        for i in range(40, 60):
            execute(pg_db, f"INSERT INTO r VALUES ({i}, {i})")
        run.wait_heads({"p1": 61})
    entries = read_entries(pub)
    assert len(entries) == 61
    assert [r[3][0] for r in row_ops(entries[1:])] == list(range(60))


def test_a_backlog_shares_fsyncs_and_arrives_whole(pg_db: str, tmp_path: Path) -> None:
    """Transactions decoded back to back are made durable together, not one fsync each.

    300 transactions written while capture is down are caught up with far fewer than
    300 fsyncs (one per transaction would cap capture at the disk's fsync rate), and
    every one of them is in the log once, in commit order.
    """
    execute(pg_db, "CREATE TABLE g(id int PRIMARY KEY, v int)")
    pub = open_pub(tmp_path, "p1", ["g"])
    with capturing(pg_db, [pub]) as run:
        execute(pg_db, "INSERT INTO g VALUES (0, 0)")
        run.wait_heads({"p1": 2})
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for i in range(1, 301):
            conn.execute("INSERT INTO g VALUES (%s, %s)", (i, i))
    fsyncs: list[int] = []
    pub.log.fsync_hook = fsyncs.append
    with capturing(pg_db, [pub]) as run:
        run.wait_heads({"p1": 302})
    assert len(fsyncs) < 100, f"{len(fsyncs)} fsyncs for 300 transactions"
    entries = read_entries(pub)
    assert [r[3][0] for r in row_ops(entries[1:])] == list(range(301))


def test_a_backlog_is_flagged_to_the_feeds_while_capture_reads_it(
    pg_db: str, tmp_path: Path
) -> None:
    """Capture reading a backlog (1,500 transactions written while it was down, the
    server sending them seconds after their commits) says so to the feeds
    (``Publication.catching_up``: the head is not live, feed.py), and stops saying so
    once it has read it all."""
    execute(pg_db, "CREATE TABLE k(id int PRIMARY KEY, v int)")
    pub = open_pub(tmp_path, "p1", ["k"])
    with capturing(pg_db, [pub]) as run:
        execute(pg_db, "INSERT INTO k VALUES (0, 0)")
        run.wait_heads({"p1": 2})
        # in step with the source (the install's own commits may have come late)
        wait_for(lambda: not pub.catching_up, what="capture in step")
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for i in range(1, 1501):
            conn.execute("INSERT INTO k VALUES (%s, %s)", (i, i))
    time.sleep(1.5)  # the backlog's commits older than _BACKLOG_S when capture reads them
    seen: list[tuple[int, bool]] = []  # (head, the flag) at each durable head
    pub.log.add_listener(lambda head: seen.append((head, pub.catching_up)))
    with capturing(pg_db, [pub]) as run:
        run.wait_heads({"p1": 1502})
        wait_for(lambda: not pub.catching_up, what="the end of the backlog")
    assert any(flag for _, flag in seen), "never flagged while reading 1,500 transactions"
    assert not pub.catching_up


def test_table_added_later_gets_schema_and_rows(pg_db: str, tmp_path: Path) -> None:
    """Adding a table to a running publication logs its snapshot before its new changes."""
    execute(
        pg_db,
        "CREATE TABLE x(id int PRIMARY KEY)",
        "CREATE TABLE y(id int PRIMARY KEY)",
        "INSERT INTO y VALUES (1), (2)",
    )
    pub = open_pub(tmp_path, "p1", ["x"])
    with capturing(pg_db, [pub]) as run:
        run.wait_heads({"p1": 1})
        execute(pg_db, "INSERT INTO x VALUES (1)")
        run.wait_heads({"p1": 2})
        added = run.cap.install("p1", pub.log.incarnation, ["x", "y"])
        assert added == ["y"]
        execute(pg_db, "INSERT INTO y VALUES (3)", "INSERT INTO x VALUES (2)")
        run.wait_heads({"p1": 4})
    ops = row_ops(read_entries(pub))
    # Row 3 of y is in the snapshot or streamed after it, depending on when capture
    # took the snapshot; either way exactly once and after the TRUNCATE.
    assert [(op, v) for t, op, _, v in ops if t == "x"] == [
        ("TRUNCATE", []),
        ("INSERT", [1]),
        ("INSERT", [2]),
    ]
    assert [(op, v) for t, op, _, v in ops if t == "y"] == [
        ("TRUNCATE", []),
        ("INSERT", [1]),
        ("INSERT", [2]),
        ("INSERT", [3]),
    ]


def test_wal_level_replica_is_a_clear_error(tmp_path: Path) -> None:
    """A source without logical WAL is refused with what to do, not a traceback."""
    with start_pg_instance(wal_level="replica") as server:
        cap = PostgresCapture(server.dsn("postgres"), slot="s1")
        try:
            with pytest.raises(SourceError, match=r"wal_level = replica.*wal_level = logical"):
                cap.check()
            with pytest.raises(SourceError, match="wal_level"):
                cap.install("p1", "inc", ["t"])
        finally:
            cap.close()


def test_role_without_replication_is_refused(pg_db: str) -> None:
    """A capture user without REPLICATION is told how to grant it."""
    execute(pg_db, "CREATE ROLE plain LOGIN")
    try:
        cap = PostgresCapture(pg_db.replace("postgres@", "plain@"), slot="s1")
        with pytest.raises(SourceError, match='ALTER ROLE "plain" REPLICATION'):
            cap.check()
        cap.close()
    finally:
        execute(pg_db, "DROP ROLE plain")


def test_invalidated_slot_is_refused(tmp_path: Path) -> None:
    """A slot whose WAL was removed (wal_status = lost) is refused with what to do."""
    with start_pg_instance(
        initdb_args=["--wal-segsize=1"], max_slot_wal_keep_size="'2MB'", min_wal_size="'2MB'"
    ) as server:
        dsn = server.dsn("postgres")
        cap = PostgresCapture(dsn, slot="lost_slot")
        try:
            cap.install("p1", "inc", [])
            cap.check()  # healthy
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE filler(x text)")
                for _ in range(8):  # 8 x ~1 MB of WAL, then a checkpoint removes it
                    conn.execute(
                        "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 1000)"
                    )
                    conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
                status = conn.execute(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'lost_slot'"
                ).fetchone()
            assert status == ("lost",)
            with pytest.raises(SourceError, match=r"invalidated.*pg_drop_replication_slot"):
                cap.check()
        finally:
            cap.close()
