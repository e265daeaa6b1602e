"""wal2json's column lists read as the catalog's (issue 19): a table's shape decoded
from wal2json equals the one its install snapshot and table copies take from the
catalog, so a copy is not followed by another one, endlessly."""

from __future__ import annotations

import psycopg
import pytest

from publisher.capture.postgres._ddlwatch import relcols
from publisher.capture.postgres._pgoutput import Relation
from publisher.capture.postgres._pgwal2json import WAL2JSON_OPTIONS, Wal2JsonDecoder

pytestmark = [pytest.mark.postgres]

DDL = """
CREATE TABLE shaped (
    id int PRIMARY KEY, vc varchar(20), ch char(5), ts3 timestamptz(3), t2 time(2),
    tz1 timetz(1), ts0 timestamp(0), b bit(8), vb varbit(12), n numeric(12, 3),
    vca varchar(7)[], plain text, nts timestamptz, nvb varbit
)
"""


def test_wal2json_columns_have_the_catalogs_typmods(pg_db: str) -> None:
    """Inserted and updated rows of a table with length- and precision-constrained
    columns decode to the catalog's (name, type, typmod) for every column."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")  # decoding reads flushed WAL only
        conn.execute(DDL)
        conn.execute("ALTER TABLE shaped REPLICA IDENTITY FULL")
        conn.execute("SELECT pg_create_logical_replication_slot('w2j_shapes', 'wal2json')")
        conn.execute("INSERT INTO shaped (id, vc, ch) VALUES (1, 'a', 'b')")
        conn.execute("UPDATE shaped SET plain = 'x'")
        options = ", ".join(f"'{k}', '{v}'" for k, v in WAL2JSON_OPTIONS.items())  # constants
        rows = conn.execute(
            f"SELECT data FROM pg_logical_slot_get_changes('w2j_shapes', NULL, NULL, {options})"
        ).fetchall()
        catalog = [(c.name, c.type_oid, c.typmod) for c in relcols(conn, "public.shaped")]
        conn.execute("SELECT pg_drop_replication_slot('w2j_shapes')")
    decoder = Wal2JsonDecoder()
    shapes = [
        [(c.name, c.type_oid, c.typmod) for c in ev.columns]
        for (data,) in rows
        for ev in decoder.decode(data.encode())
        if isinstance(ev, Relation)
    ]
    assert shapes == [catalog]
