"""PostgreSQL -> PostgreSQL carries every built-in type exactly (real daemons, real
private instances), and refuses at install the types it cannot carry."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from publisher.capture.postgres import PostgresCapture
from publisher.errors import SourceError
from tests.support.harness import Pair, wait_until
from tests.support.pg_types import (
    COLUMNS,
    SCHEMA,
    TypedWorkload,
    schema_sql,
    table_text,
)
from tests.support.workload import run_pg

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

# wal2json writes NaN and +-Infinity of these as null: capture refuses them under it.
WAL2JSON_COLUMNS = [
    c for c in COLUMNS if c[1].split("(")[0] not in ("numeric", "real", "double precision")
]

KEYS = {"typed": ["id"], "keyed": ["k_uuid", "k_inet"]}


def _differences(
    src_dsn: str, dst_dsn: str, history: bool = False, tables: tuple[str, ...] = tuple(KEYS)
) -> list[str]:
    """Rows of ``tables`` that differ between source and target, as text (empty when
    equal); ``history``: the target's current versions."""
    out: list[str] = []
    with psycopg.connect(src_dsn) as src, psycopg.connect(dst_dsn) as dst:
        for table in tables:
            key = KEYS[table]
            columns = [
                str(r[0])
                for r in src.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                    " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                    (table,),
                )
            ]
            try:
                current = "_last_seq IS NULL AND _op <> 'D'" if history else "TRUE"
                theirs = table_text(dst, table, columns, key, current)
            except psycopg.Error as e:
                return [f"{table}: {e}"]
            ours = table_text(src, table, columns, key)
            if len(ours) != len(theirs):
                out.append(f"{table}: {len(ours)} rows on the source, {len(theirs)} on the target")
            mine = {r[: len(key)]: r for r in ours}
            other = {r[: len(key)]: r for r in theirs}
            for k in sorted(set(mine) | set(other), key=str):
                a, b = mine.get(k), other.get(k)
                if a is None or b is None:
                    out.append(f"{table} {k}: only on the {'target' if a is None else 'source'}")
                    continue
                for name, x, y in zip(columns, a, b, strict=True):
                    if x != y:
                        out.append(f"{table} {k} {name}: source {x!r:.80} target {y!r:.80}")
    return out


def _settle(pair: Pair, src_dsn: str, dst_dsn: str, history: bool = False) -> None:
    """Wait until the target equals the source (or the subscription stops in error)."""

    def done() -> bool:
        state = pair.status().state
        if state == "error":
            return True
        return state == "in_sync" and not _differences(src_dsn, dst_dsn, history)

    try:
        wait_until(done, 180, "the target to equal the source", interval=0.5)
    except TimeoutError:
        pass
    st = pair.status()
    diff = _differences(src_dsn, dst_dsn, history)
    assert (st.state, diff) == ("in_sync", []), f"last error: {st.last_error}\n" + "\n".join(
        diff[:40]
    )


JDBC = {
    "spark": {"jars": ["/usr/share/java/postgresql.jar"]},
    "apply": {"jdbc_min_rows": 1, "spark_min_rows": 0},
}

HISTORY = {"apply": {"tables": {t: {"history": True} for t in KEYS}}}

# Every type through the Spark expressions of transforms: a filter every row passes
# and a computed column (the comparison reads the source's columns only).
TRANSFORMS = {
    "apply": {
        "spark_min_rows": 0,
        "tables": {
            "typed": {"filter": "id IS NOT NULL", "computed": {"id_twice": "id * 2"}},
            "keyed": {"filter": "k_uuid IS NOT NULL"},
        },
    }
}


@pytest.mark.parametrize(
    ("target_tables", "plugin", "subscriber_extra"),
    [
        pytest.param("txrepl", "pgoutput", {}, id="pgoutput-copy"),
        pytest.param("operator", "pgoutput", {}, id="pgoutput-operator_tables"),
        pytest.param("txrepl", "wal2json", JDBC, id="wal2json-jdbc_staging"),
        pytest.param("txrepl", "pgoutput", HISTORY, id="pgoutput-history"),
        pytest.param("txrepl", "pgoutput", TRANSFORMS, id="pgoutput-transforms"),
    ],
)
def test_every_type_round_trips_through_the_daemons(
    tmp_path: Path, pg_server, target_tables: str, plugin: str, subscriber_extra: dict[str, Any]
) -> None:
    """Rows of every built-in type (NULLs, extremes, TOASTed values left out of updates,
    key changes, deletes) reach a PostgreSQL target value for value: rows present at
    install, a backlog applied in one big batch, then live small batches; into tables
    txrepl creates, or that the operator created with the source's DDL (enums, domains,
    composites and all); decoded by pgoutput or wal2json; staged by COPY or by Spark
    over JDBC; kept as history (current versions compared); shaped by transforms
    (Spark expressions: a filter and a computed column); a uuid[] column added
    mid-stream; and loaded from a snapshot (reinit) into an empty database."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    columns = WAL2JSON_COLUMNS if plugin == "wal2json" else COLUMNS
    if target_tables == "operator":
        with psycopg.connect(dst_dsn, autocommit=True) as dst:
            dst.execute(schema_sql(columns))
    src = psycopg.connect(src_dsn, autocommit=True)
    src.execute(schema_sql(columns))
    work = TypedWorkload(seed=19, columns=columns)
    run_pg(src, work.transactions(40))  # present when the table is added
    pair = Pair(
        tmp_path,
        tables=list(KEYS),
        source_url=src_dsn,
        target_url=dst_dsn,
        publisher_extra={"slot": "txrepl_" + dst_dsn.rsplit("/", 1)[-1], "plugin": plugin},
        subscriber_extra=subscriber_extra,
    )
    try:
        pair.start_publisher()
        run_pg(src, work.transactions(300))  # a backlog before the subscriber exists
        pair.start_subscriber()
        history = subscriber_extra is HISTORY
        _settle(pair, src_dsn, dst_dsn, history)
        # a column added mid-stream, of a type the wire carries as text, filled at once
        src.execute("ALTER TABLE keyed ADD COLUMN extra uuid[]")
        src.execute("UPDATE keyed SET extra = ARRAY[md5(k_uuid::text)::uuid, NULL]")
        for _ in range(60):  # live: small batches
            run_pg(src, work.transactions(1))
        _settle(pair, src_dsn, dst_dsn, history)
        if (
            subscriber_extra is not TRANSFORMS
            and target_tables == "txrepl"
            and plugin == "pgoutput"
        ):
            # and by a reinit's snapshot
            fresh = pg_server.create_database()
            pair.load_snapshot(fresh)
            assert _differences(src_dsn, fresh) == []
        if subscriber_extra is TRANSFORMS:
            # a reinit shapes the snapshot's rows as the apply does (variant values too:
            # a time of 24:00 is no Python time)
            assert pair.sub is not None
            pair.sub.stop()
            with psycopg.connect(dst_dsn, autocommit=True) as dst:
                dst.execute("DELETE FROM typed")
            out = subprocess.run(pair.reinit_argv(), capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stdout + out.stderr
            assert _differences(src_dsn, dst_dsn) == []
        if subscriber_extra is JDBC:  # the rows went through Spark's JDBC staging tables
            with psycopg.connect(dst_dsn) as dst:
                assert dst.execute(
                    "SELECT count(*) FROM pg_class WHERE relname LIKE 'txrepl\\_jdbc\\_%'"
                ).fetchone() != (0,)
    finally:
        pair.stop()
        src.close()


def test_a_type_that_cannot_be_carried_is_refused_at_install(pg_db: str) -> None:
    """A table with an ``aclitem`` column (an array of them, through a domain) is refused
    when added, naming table, column and type, and nothing is installed; a table of
    carried types installs.  Under wal2json a numeric column is refused (wal2json
    writes NaN as null)."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("CREATE DOMAIN perms AS aclitem[]")
        conn.execute("CREATE TABLE grants (id int PRIMARY KEY, note text, acl perms)")
    cap = PostgresCapture(pg_db, slot="s_refuse")
    try:
        with pytest.raises(SourceError, match=r"'grants', column 'acl'.*type aclitem\b"):
            cap.install("p", "inc", ["typed", "grants"])
        assert cap.install("p", "inc", ["keyed", "typed"]) == ["keyed", "typed"]
    finally:
        cap.close()
    cap = PostgresCapture(pg_db, slot="s_refuse_w2j", plugin="wal2json")
    try:
        with pytest.raises(SourceError, match=r"'typed', column 'c_num'.*numeric.*pgoutput"):
            cap.install("p", "inc", ["keyed", "typed"])
    finally:
        cap.close()


def test_the_publisher_serves_the_other_tables_when_one_is_refused(
    tmp_path: Path, pg_server
) -> None:
    """A published table with a column type that cannot be carried, and one without a
    primary key, are left out with an error line naming table, column and type; the
    publisher runs, and the publication's other table replicates."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    src = psycopg.connect(src_dsn, autocommit=True)
    src.execute(SCHEMA)
    src.execute("CREATE TABLE grants (id int PRIMARY KEY, acl aclitem)")
    src.execute("CREATE TABLE nokey (a int)")
    work = TypedWorkload(seed=7)
    pair = Pair(
        tmp_path,
        tables=["grants", "keyed", "nokey"],
        source_url=src_dsn,
        target_url=dst_dsn,
        publisher_extra={"slot": "txrepl_" + dst_dsn.rsplit("/", 1)[-1]},
    )
    try:
        pair.start_publisher()
        pair.start_subscriber()
        run_pg(src, work.transactions(80))
        wait_until(lambda: not _differences(src_dsn, dst_dsn, tables=("keyed",)), 120, "keyed", 0.5)
        log = (tmp_path / "publisher.log").read_text()
        assert "'grants', column 'acl': type aclitem cannot be replicated exactly" in log
        assert "'nokey' has no PRIMARY KEY" in log
        with psycopg.connect(dst_dsn) as dst:
            assert dst.execute("SELECT to_regclass('grants'), to_regclass('nokey')").fetchone() == (
                None,
                None,
            )
    finally:
        pair.stop()
        src.close()
