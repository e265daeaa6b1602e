"""PostgreSQL -> PostgreSQL with identity keys and stored generated columns (real
daemons, real private instances): the publisher's identity values arrive, the
generated columns are computed by the target."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.support.harness import Pair, wait_until
from tests.support.pg_types import table_text

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

DDL = """
CREATE TABLE items (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    qty integer NOT NULL,
    price numeric(10, 2) NOT NULL,
    total numeric GENERATED ALWAYS AS (qty * price) STORED
)
"""
COLUMNS = ["id", "name", "qty", "price", "total"]


def _work(conn: psycopg.Connection[tuple[object, ...]], n: int, start: int) -> None:
    """``n`` transactions: inserts (identity ids), updates, a delete now and then."""
    for i in range(start, start + n):
        with conn.transaction():
            conn.execute(
                "INSERT INTO items (name, qty, price) VALUES (%s, %s, %s)",
                (f"item {i}", i % 7, i + 0.25),
            )
            conn.execute("UPDATE items SET qty = qty + 1 WHERE id %% 3 = %s", (i % 3,))
            if i % 5 == 0:
                conn.execute("DELETE FROM items WHERE id = (SELECT min(id) FROM items)")


def _differences(src_dsn: str, dst_dsn: str) -> list[str]:
    with psycopg.connect(src_dsn) as src, psycopg.connect(dst_dsn) as dst:
        ours = table_text(src, "items", COLUMNS, ["id"])
        try:
            theirs = table_text(dst, "items", COLUMNS, ["id"])
        except psycopg.Error as e:
            return [str(e)]
    return [f"source {a} target {b}" for a, b in zip(ours, theirs, strict=False) if a != b] + (
        [f"{len(ours)} rows on the source, {len(theirs)} on the target"]
        if len(ours) != len(theirs)
        else []
    )


def _settle(pair: Pair, src_dsn: str, dst_dsn: str) -> None:
    def done() -> bool:
        state = pair.status().state  # in sync too: a catch-up's rows land just before it
        return state == "error" or (state == "in_sync" and not _differences(src_dsn, dst_dsn))

    try:
        wait_until(done, 180, "the target to equal the source", interval=0.5)
    except TimeoutError:
        pass
    st = pair.status()
    diff = _differences(src_dsn, dst_dsn)
    assert (st.state, diff) == ("in_sync", []), f"last error: {st.last_error}\n" + "\n".join(
        diff[:20]
    )


def _pair(tmp_path: Path, src_dsn: str, dst_dsn: str) -> Pair:
    return Pair(
        tmp_path,
        tables=["items"],
        source_url=src_dsn,
        target_url=dst_dsn,
        publisher_extra={"slot": "txrepl_" + dst_dsn.rsplit("/", 1)[-1]},
    )


def test_identity_and_generated_columns_into_operator_tables(tmp_path: Path, pg_server) -> None:
    """Into a target table the operator created with the source's DDL (identity ALWAYS
    key, stored generated column): rows present at install, a backlog in one batch,
    then live small batches arrive with the source's ids, and the target computes the
    generated column to the source's value."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    with psycopg.connect(dst_dsn, autocommit=True) as dst:
        dst.execute(DDL)
    src = psycopg.connect(src_dsn, autocommit=True)
    src.execute(DDL)
    _work(src, 20, 0)  # present when the table is added
    pair = _pair(tmp_path, src_dsn, dst_dsn)
    try:
        pair.start_publisher()
        _work(src, 100, 20)  # a backlog before the subscriber exists
        pair.start_subscriber()
        _settle(pair, src_dsn, dst_dsn)
        for i in range(120, 150):  # live: small batches
            _work(src, 1, i)
        _settle(pair, src_dsn, dst_dsn)
    finally:
        pair.stop()
        src.close()


SPECIAL = (
    "SELECT attname, attidentity, attgenerated FROM pg_attribute WHERE attrelid = 'items'::regclass"
    " AND attname IN ('id', 'total') ORDER BY attname"
)


def test_identity_and_generated_columns_on_tables_txrepl_creates(
    tmp_path: Path, pg_server, spark
) -> None:
    """Into a target without the table: txrepl creates ``id`` as an identity (BY
    DEFAULT: the publisher's ids are written on every path) and ``total`` as the
    source's stored generated column, computed by the target, through the install
    snapshot, a backlog and live batches, and again by a reinit into an empty target;
    the promoted target's next id is the source's next id."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    src = psycopg.connect(src_dsn, autocommit=True)
    src.execute(DDL)
    _work(src, 5, 0)
    pair = _pair(tmp_path, src_dsn, dst_dsn)
    fresh = pg_server.create_database()
    try:
        pair.start_publisher()
        _work(src, 20, 5)
        pair.start_subscriber()
        _settle(pair, src_dsn, dst_dsn)
        for i in range(25, 30):
            _work(src, 1, i)
        _settle(pair, src_dsn, dst_dsn)
        pair.load_snapshot(fresh, spark=spark)
    finally:
        pair.stop()
    assert _differences(src_dsn, fresh) == []
    want = [("id", "d", ""), ("total", "", "s")]
    got = []
    for dsn in (src_dsn, dst_dsn, fresh):
        with psycopg.connect(dsn, autocommit=True) as conn:
            special = conn.execute(SPECIAL).fetchall()
            top = conn.execute("SELECT max(id) FROM items").fetchone()
            row = conn.execute(
                "INSERT INTO items (name, qty, price) VALUES ('local', 2, 1.5) RETURNING id, total"
            ).fetchone()
            got.append((special, top, row))
    src.close()
    (_, _, source_row), (created, _, promoted_row), (reloaded, top, reinit_row) = got
    assert created == want
    assert reloaded == want
    assert promoted_row == source_row  # the promoted target goes on where the source is
    assert top is not None
    assert source_row is not None
    assert reinit_row == (top[0] + 1, source_row[1])  # a reinit: past every loaded id
