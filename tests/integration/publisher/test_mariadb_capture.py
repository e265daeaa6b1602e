"""The MariaDB source beyond the capture contract: its types, its refusals, a schema change.

Real capture of a private mariadbd's binary log (tests/fixtures/mariadb.py) into real
logs; the same rows read by the install snapshot (a query) and by the stream (the
binary log) must give the same wire values, since a target cannot tell them apart.
"""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pytest

from common.dburl import DatabaseUrl
from publisher.capture import SourceOptions
from publisher.capture.dialects import open_source
from publisher.capture.thread import CaptureThread
from publisher.errors import SourceError
from publisher.publication import Publication
from tests.fixtures.mariadb import MariaServer
from tests.support.pg_capture import open_pub, read_entries, row_ops, wait_for
from tests.support.workload import maria_commit

pytestmark = pytest.mark.mariadb

TYPES = """CREATE TABLE typed (
    id INT PRIMARY KEY, ti TINYINT, bo BOOLEAN, big BIGINT, ubig BIGINT UNSIGNED,
    yr YEAR, dec_ DECIMAL(12,3), dbl DOUBLE, flt FLOAT, vc VARCHAR(20), tx TEXT,
    en ENUM('a','b'), js JSON, bin BINARY(3), vb VARBINARY(10), bl BLOB, d DATE,
    dtm DATETIME(6), ts TIMESTAMP(3) NULL, tm TIME(6), tneg TIME
)"""
ROW = (
    "({id}, -128, 1, -9223372036854775808, 18446744073709551615, 2024, -123456789.125,"
    " -0.1, 1.1, 'Ünï ✓', REPEAT('x', 300), 'b', '{{\"a\": [1, 2]}}', x'0001', x'', x'00ff',"
    " '1969-12-31', '2024-02-29 23:59:59.999999', '2024-02-29 12:00:00.123',"
    " '23:59:59.5', '-01:02:03')"
)


def _capture(url: str, tmp_path: Path, tables: list[str]) -> tuple[Publication, CaptureThread]:
    pub = open_pub(tmp_path / "logs", "p", tables)
    source = open_source(DatabaseUrl.parse(url), SourceOptions())
    source.install(pub.name, pub.log.incarnation, tables)
    thread = CaptureThread(source, [pub])
    thread.start()
    return pub, thread


def _stop(thread: CaptureThread) -> None:
    thread.halt.set()
    thread.join(30)
    assert not thread.is_alive()
    thread.source.release()


def test_snapshot_and_binlog_give_the_same_values_for_every_mapped_type(
    maria_db: str, tmp_path: Path
) -> None:
    """A row read by the install snapshot and its twin read from the binary log: equal."""
    maria_commit(maria_db, TYPES, "INSERT INTO typed VALUES " + ROW.format(id=1))
    pub, thread = _capture(maria_db, tmp_path, ["typed"])
    try:
        wait_for(lambda: len(row_ops(read_entries(pub))) >= 2, 30, "the snapshot")  # +TRUNCATE
        maria_commit(maria_db, "INSERT INTO typed VALUES " + ROW.format(id=2))
        wait_for(lambda: len(row_ops(read_entries(pub))) >= 3, 30, "the streamed row")
    finally:
        _stop(thread)
    entries = read_entries(pub)
    schema = entries[0].ops[0].schema
    assert schema.source_dialect == "mariadb"
    kinds = {c.name: (c.type, c.precision, c.scale) for c in schema.columns}
    assert kinds["ubig"][1:] == (20, 0)
    assert kinds["dec_"][1:] == (12, 3)
    ops = [(op, row) for _, op, _, row in row_ops(entries) if op == "INSERT"]
    (_, snap), (_, streamed) = ops
    assert streamed[0] == 2
    assert snap[1:] == streamed[1:]
    assert snap[1:] == [
        -128,
        1,
        -9223372036854775808,
        decimal.Decimal("18446744073709551615"),
        2024,
        decimal.Decimal("-123456789.125"),
        -0.1,
        1.100000023841858,  # the single-precision value, exactly
        "Ünï ✓",
        "x" * 300,
        "b",
        '{"a": [1, 2]}',
        b"\x00\x01\x00",  # BINARY(3) keeps its pad
        b"",
        b"\x00\xff",
        dt.date(1969, 12, 31),
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
        dt.datetime(2024, 2, 29, 12, 0, 0, 123000, tzinfo=dt.UTC),
        dt.time(23, 59, 59, 500000),
        "-01:02:03",  # a duration, no time of day: carried as text
    ]
    pub.log.close()


@pytest.mark.parametrize(
    ("column", "shown"),
    [
        ("b BIT(3)", r"column 'b' has type bit\(3\)"),
        ("s SET('x','y')", r"column 's' has type set\('x','y'\)"),
        ("g POINT", r"column 'g' has type point"),
    ],
)
def test_a_column_without_exact_carriage_is_refused_at_install_by_name(
    maria_db: str, column: str, shown: str
) -> None:
    """Install refuses a table with a type capture cannot carry: table, column and type."""
    maria_commit(maria_db, f"CREATE TABLE odd (id INT PRIMARY KEY, {column})")
    source = open_source(DatabaseUrl.parse(maria_db), SourceOptions())
    try:
        with pytest.raises(SourceError, match=rf"table 'odd' {shown}"):
            source.install("p", "inc", ["odd"])
    finally:
        source.release()


def test_a_table_without_transactions_is_refused(maria_db: str) -> None:
    """A MyISAM table is refused: its commits and a consistent snapshot do not agree."""
    maria_commit(maria_db, "CREATE TABLE plain (id INT PRIMARY KEY) ENGINE=MyISAM")
    source = open_source(DatabaseUrl.parse(maria_db), SourceOptions())
    try:
        with pytest.raises(SourceError, match="'plain' uses the MyISAM engine"):
            source.install("p", "inc", ["plain"])
    finally:
        source.release()


def test_an_added_column_reaches_the_log_before_the_row_that_has_it(
    maria_db: str, tmp_path: Path
) -> None:
    """ALTER TABLE ADD COLUMN then a row: a schema op with the new column precedes it."""
    maria_commit(
        maria_db, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT)", "INSERT INTO t VALUES (1, 'a')"
    )
    pub, thread = _capture(maria_db, tmp_path, ["t"])
    try:
        wait_for(lambda: len(row_ops(read_entries(pub))) >= 2, 30, "the snapshot")
        maria_commit(maria_db, "ALTER TABLE t ADD COLUMN w INT")
        maria_commit(maria_db, "INSERT INTO t VALUES (2, 'b', 7)")
        wait_for(lambda: len(row_ops(read_entries(pub))) >= 3, 30, "the new row")
    finally:
        _stop(thread)
    ops = [op for e in read_entries(pub) for op in e.ops]
    last_schema = max(i for i, op in enumerate(ops) if op.HasField("schema"))
    assert [c.name for c in ops[last_schema].schema.columns] == ["id", "v", "w"]
    assert ops[last_schema + 1].row.table == "t"
    assert row_ops(read_entries(pub))[-1][3] == [2, "b", 7]
    pub.log.close()


def test_a_server_without_column_names_in_its_binary_log_is_refused_in_one_line(
    maria_server: MariaServer, maria_db: str
) -> None:
    """binlog_row_metadata=MINIMAL: the source does not open, and says which setting."""
    maria_server.execute("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
    try:
        with pytest.raises(SourceError) as err:
            open_source(DatabaseUrl.parse(maria_db), SourceOptions())
    finally:
        maria_server.execute("SET GLOBAL binlog_row_metadata = 'FULL'")
    message = str(err.value)
    assert "binlog_row_metadata=MINIMAL" in message
    assert "binlog_row_metadata=FULL" in message
    assert "\n" not in message
