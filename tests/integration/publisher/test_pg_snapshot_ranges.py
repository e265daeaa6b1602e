"""Key ranges of a PostgreSQL snapshot read: every key in exactly one range.

A real private PostgreSQL (tests/fixtures/postgres.py); the keys are sparse,
negative and near the top of bigint, where even splitting by min and max makes
ranges of very different sizes.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres._pgcatalog import TableName, TableShape
from publisher.capture.postgres._readers import key_ranges

KEYS = [-(2**63), -7, 0, 1, 2, 3, 40, 41, 10**12, 2**62, 2**63 - 1]


def test_sparse_integer_keys_fall_each_in_exactly_one_range(pg_server: Any) -> None:
    """Split into as many ranges as there are keys, the ranges read every key once."""
    dsn = pg_server.create_database()
    schema = pb.TableSchema(
        table="t",
        columns=[pb.Column(name="id", type=pb.ColumnType.COLUMN_TYPE_INTEGER)],
        primary_key=["id"],
    )
    shape = TableShape(schema, (), (0,))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t(id bigint PRIMARY KEY)")
        conn.cursor().executemany("INSERT INTO t VALUES (%s)", [(k,) for k in KEYS])
        for range_rows in (1, 2, 5):
            pieces = key_ranges(conn, TableName("public", "t"), shape, len(KEYS), range_rows)
            assert len(pieces) == -(-len(KEYS) // range_rows)
            seen: list[int] = []
            for p in pieces:
                assert p.where is not None
                query = sql.SQL("SELECT id FROM t WHERE {}").format(p.where)
                seen += [int(r[0]) for r in conn.execute(query).fetchall()]
            assert sorted(seen) == KEYS, range_rows
        whole = key_ranges(conn, TableName("public", "t"), shape, len(KEYS), len(KEYS))
        assert [p.where for p in whole] == [None]
