"""The private PostgreSQL fixtures: a logical-WAL server, fresh databases, extra instances."""

from __future__ import annotations

import psycopg
import pytest

from tests.fixtures.postgres import PgServer, start_pg_instance

pytestmark = pytest.mark.postgres


def test_pg_server_is_private_and_logical(pg_server: PgServer) -> None:
    """The session server listens on 127.0.0.1 with wal_level=logical and enough slots."""
    with psycopg.connect(pg_server.dsn("postgres")) as conn:
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["wal_level", "max_replication_slots", "max_wal_senders", "port"],),
            ).fetchall()
        )
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 20
    assert int(settings["port"]) == pg_server.port
    assert pg_server.dsn("x") == f"postgresql://postgres@127.0.0.1:{pg_server.port}/x"


def test_pg_db_is_fresh(pg_db: str) -> None:
    """Each test gets its own empty database."""
    with psycopg.connect(pg_db) as conn:
        n = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert n == (0,)


def test_replication_connection_is_trusted(pg_server: PgServer) -> None:
    """A replication connection over 127.0.0.1 is accepted (the host replication line)."""
    import psycopg2
    import psycopg2.extras

    conn = psycopg2.connect(
        pg_server.dsn("postgres"), connection_factory=psycopg2.extras.LogicalReplicationConnection
    )
    try:
        cur = conn.cursor()
        cur.execute("IDENTIFY_SYSTEM")
        assert cur.fetchone() is not None
    finally:
        conn.close()


def test_extra_instance_with_other_settings() -> None:
    """start_pg_instance starts a second server with overridden settings and removes it."""
    with start_pg_instance(wal_level="replica") as other:
        with psycopg.connect(other.dsn("postgres")) as conn:
            row = conn.execute("SHOW wal_level").fetchone()
        assert row == ("replica",)
        base = other.base_dir
    assert not base.exists()
