"""PostgreSQL source and target with foreign keys: install and TRUNCATE end to end."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.support.harness import Pair, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

DDL = (
    "CREATE TABLE parent (id int PRIMARY KEY, v text);"
    "CREATE TABLE child (id int PRIMARY KEY, p int REFERENCES parent, v text);"
)


def _rows(dsn: str) -> list[list[tuple[object, ...]]]:
    with psycopg.connect(dsn) as c:
        return [c.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in ("parent", "child")]


def _settle(pair: Pair, src_dsn: str, dst_dsn: str) -> None:
    def done() -> bool:
        if pair.status().state == "error":
            return True
        try:
            return _rows(src_dsn) == _rows(dst_dsn)
        except psycopg.Error:
            return False

    try:
        wait_until(done, 120, "the target to equal the source", interval=0.5)
    except TimeoutError:
        pass
    st = pair.status()
    assert st.state == "in_sync", f"last error: {st.last_error}"
    assert _rows(dst_dsn) == _rows(src_dsn)


@pytest.mark.parametrize("late", [False, True], ids=["running", "one-batch"])
def test_parent_child_with_foreign_keys_install_and_truncate(
    tmp_path: Path, pg_server, late: bool
) -> None:
    """Tables with a foreign key on both sides: the install's truncate and the source's
    TRUNCATE of both tables (one statement) apply; the target equals the source."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    src = psycopg.connect(src_dsn, autocommit=True)
    src.execute(DDL)
    with psycopg.connect(dst_dsn, autocommit=True) as dst:
        dst.execute(DDL)

    def fill(base: int) -> None:
        src.execute(
            "INSERT INTO parent SELECT g, 'p' || g FROM generate_series(%s::int, %s::int) g",
            (base, base + 9),
        )
        src.execute(
            "INSERT INTO child SELECT g, g, 'c' || g FROM generate_series(%s::int, %s::int) g",
            (base, base + 9),
        )

    fill(1)
    pair = Pair(
        tmp_path,
        tables=["parent", "child"],
        source_url=src_dsn,
        target_url=dst_dsn,
        publisher_extra={"slot": "txrepl_" + dst_dsn.rsplit("/", 1)[-1]},
    )
    try:
        pair.start_publisher()
        if not late:
            pair.start_subscriber()
            _settle(pair, src_dsn, dst_dsn)
        src.execute("TRUNCATE parent, child")
        fill(100)
        if late:
            pair.start_subscriber()
        _settle(pair, src_dsn, dst_dsn)
        assert _rows(dst_dsn)[1][0][0] == 100
    finally:
        pair.stop()
        src.close()
