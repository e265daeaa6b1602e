"""The differential test: seeded schemas and transaction streams written to a real
source, replicated through the real daemons, and the target compared with the source
row for row and value for value (through the documented mapping across dialects:
docs/types.md), in all four source/target combinations, first as one big batch
(the subscriber paused while the stream is written) and then as small live batches.

``TXREPL_DIFF_SCALE`` (default 1) multiplies the transactions; the ``slow`` variant
runs another seed with five times as many.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from tests.support.diffgen import Schema, Workload, differences, make_schema, run
from tests.support.harness import Pair, wait_until

pytestmark = [pytest.mark.spark]

SCALE = int(os.environ.get("TXREPL_DIFF_SCALE", "1"))

# What each path leaves out of the generator, because it is refused at install
# (test_cross_dialect_refusals): SQLite columns without a declared type have no
# PostgreSQL type; wal2json writes NaN and +-Infinity of numeric and floats as null
# (test_pg_types.py::test_a_type_that_cannot_be_carried_is_refused_at_install).
EXCLUDED = {
    ("sqlite", "postgresql", ""): ("c_any",),
    ("postgresql", "postgresql", "wal2json_jdbc"): ("c_num", "c_num_s", "c_f4", "c_f8"),
    ("postgresql", "sqlite", "wal2json"): ("c_num", "c_num_s", "c_f4", "c_f8"),
}

# The other capture and apply paths, run in one combination each (publisher's and
# subscriber's extra settings): wal2json capture, with Spark's JDBC staging for every
# batch on the PostgreSQL target; wal2json capture into a SQLite target.
PATHS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "wal2json_jdbc": (
        {"plugin": "wal2json"},
        {
            "spark": {"jars": ["/usr/share/java/postgresql.jar"]},
            "apply": {"jdbc_min_rows": 1, "spark_min_rows": 0},
        },
    ),
    "wal2json": ({"plugin": "wal2json"}, {}),
}

COMBOS = [
    pytest.param("sqlite", "sqlite", "", id="sqlite-sqlite"),
    pytest.param("sqlite", "postgresql", "", id="sqlite-postgresql", marks=pytest.mark.postgres),
    pytest.param("postgresql", "sqlite", "", id="postgresql-sqlite", marks=pytest.mark.postgres),
    pytest.param("postgresql", "postgresql", "", id="postgresql-postgresql",
                 marks=pytest.mark.postgres),
    pytest.param("postgresql", "postgresql", "wal2json_jdbc",
                 id="postgresql-postgresql-wal2json_jdbc", marks=pytest.mark.postgres),
    pytest.param("postgresql", "sqlite", "wal2json", id="postgresql-sqlite-wal2json",
                 marks=pytest.mark.postgres),
]  # fmt: skip


def _database(dialect: str, tmp_path: Path, name: str, request: pytest.FixtureRequest) -> str:
    if dialect == "sqlite":
        path = tmp_path / f"{name}.db"
        sqlite3.connect(str(path)).close()
        return f"sqlite:///{path}"
    return str(request.getfixturevalue("pg_server").create_database())


def _connect(schema: Schema, url: str) -> Any:
    conn: Any
    if schema.dialect == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
    else:
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
    for stmt in schema.ddl():
        conn.execute(stmt)
    return conn


def _execute(dialect: str, url: str, statement: str) -> None:
    if dialect == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(statement)
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def _where(url: str) -> str | Path:
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:") else url


def _control(pair: Pair, call: str) -> None:
    assert pair.sub is not None
    with grpc.insecure_channel(pair.sub.address) as ch:
        getattr(rpc.SubscriberControlStub(ch), call)(pb.SubscriptionRequest(), timeout=10)


def _settle(pair: Pair, schema: Schema, src: str, target: str, dst: str) -> None:
    """Wait until the subscription is in sync and the target equals the source (or the
    subscription stops in error): a catch-up's last rows land just before in sync."""

    def diff() -> list[str]:
        return differences(schema, _where(src), target, _where(dst))

    def done() -> bool:
        state = pair.status().state
        return state == "error" or (state == "in_sync" and not diff())

    try:
        wait_until(done, 180, "the target to equal the source", interval=0.5)
    except TimeoutError:
        pass
    st = pair.status()
    found = diff()
    assert (st.state, found) == ("in_sync", []), f"{st.last_error}\n" + "\n".join(found)


def _runs() -> list[Any]:
    """COMBOS with each seed (the slow one five times as many transactions); the other
    paths (``path``) with the first seed only: the suite's time."""
    out = []
    for seed, txns, slow in ((1, 150, False), (2, 750, True)):
        for combo in COMBOS:
            source, target, path = combo.values
            if path and slow:
                continue
            n = txns // 3 if path else txns  # every type in a third of the stream
            marks = (*combo.marks, pytest.mark.slow) if slow else combo.marks
            out.append(
                pytest.param(
                    source, target, path, seed, n, id=f"{seed}-{n}-{combo.id}", marks=marks
                )
            )
    return out


@pytest.mark.parametrize(("source", "target", "path", "seed", "txns"), _runs())
def test_target_equals_source(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    source: str,
    target: str,
    path: str,
    seed: int,
    txns: int,
) -> None:
    """Every type (NULLs, extremes, values of another storage class on SQLite, large
    values left out of updates), key changes, deletes and transactions over many
    tables reach the target exactly: rows present at install, one big batch, then
    live small batches; and a reinit (the snapshot path) rebuilds a damaged target.
    ``path`` (PATHS) "wal2json_jdbc": wal2json capture and JDBC staging instead of
    pgoutput and COPY; "wal2json": wal2json capture into a SQLite target."""
    txns *= SCALE
    schema = make_schema(
        source,
        seed,
        odd=source == target == "sqlite",
        exclude=EXCLUDED.get((source, target, path), ()),
    )
    src_url = _database(source, tmp_path, "source", request)
    dst_url = _database(target, tmp_path, "target", request)
    conn = _connect(schema, src_url)
    work = Workload(schema, seed)
    run(conn, source, work.transactions(20))  # present when the tables are added
    pub_extra, sub_extra = PATHS.get(path, ({}, {}))
    extra: dict[str, Any] = dict(pub_extra)
    if source == "postgresql":
        extra["slot"] = "txrepl_" + src_url.rsplit("/", 1)[-1]
    pair = Pair(
        tmp_path,
        tables=[t.name for t in schema.tables],
        source_url=src_url,
        target_url=dst_url,
        publisher_extra=extra,
        subscriber_extra=sub_extra,
    )
    try:
        pair.start_publisher()
        pair.start_subscriber()
        _settle(pair, schema, src_url, target, dst_url)
        _control(pair, "Pause")  # one big batch
        run(conn, source, work.transactions(txns))
        _control(pair, "Resume")
        _settle(pair, schema, src_url, target, dst_url)
        for stmts in work.transactions(max(20, txns // 5)):  # live: small batches
            run(conn, source, iter([stmts]))
            time.sleep(0.01)
        _settle(pair, schema, src_url, target, dst_url)
        if path == "wal2json_jdbc":  # the rows went through Spark's JDBC staging tables
            import psycopg

            with psycopg.connect(dst_url) as dst:
                staged = "SELECT count(*) FROM pg_class WHERE relname LIKE 'txrepl\\_jdbc\\_%'"
                assert dst.execute(staged).fetchone() != (0,)
        assert pair.sub is not None
        pair.sub.stop()  # and a reinit (the snapshot path) rebuilds a damaged target
        _execute(target, dst_url, 'DELETE FROM "t_all"')
        out = subprocess.run(pair.reinit_argv(), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        found = differences(schema, _where(src_url), target, _where(dst_url))
        assert found == [], "after reinit:\n" + "\n".join(found)
    finally:
        pair.stop()
        conn.close()


@pytest.mark.postgres
def test_a_sqlite_column_without_a_type_is_refused_by_a_postgresql_target(
    tmp_path: Path, pg_db: str
) -> None:
    """SQLite -> PostgreSQL: a column without a declared type (any storage class in any
    row) has no PostgreSQL type: the table is refused when it is added, in one line
    naming table, column and type, and nothing of it is created on the target."""
    pair = Pair(tmp_path, tables=["loose"], target_url=pg_db)
    src = sqlite3.connect(str(pair.source_path))
    src.execute("CREATE TABLE loose (id INTEGER PRIMARY KEY, anything)")
    src.execute("INSERT INTO loose VALUES (1, 'text'), (2, x'00'), (3, 1.5)")
    src.commit()
    try:
        pair.start_publisher()
        pair.start_subscriber()
        wait_until(lambda: pair.status().state == "error", 120, "the refusal")
        error = pair.status().last_error
        assert (
            "table 'loose', column 'anything': a SQLite column without a declared type has "
            "no PostgreSQL type" in error
        )
        assert "Traceback" not in error
        import psycopg

        with psycopg.connect(pg_db) as dst:
            assert dst.execute("SELECT to_regclass('loose')").fetchone() == (None,)
    finally:
        pair.stop()
        src.close()
