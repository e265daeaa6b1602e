"""Private PostgreSQL 15 clusters for benchmarks, and W1 on PostgreSQL.

Built on :mod:`tests.fixtures.postgres` (``start_pg_instance``), with two differences
for benchmarks: no pytest (a missing server is a reason to print, not a skip), and
``synchronous_commit = on``: logical decoding only reads flushed WAL, so an
asynchronous commit would wait for the WAL writer (up to ``wal_writer_delay``) and
inflate PostgreSQL's lag.  ``fsync`` stays off by default (``TXREPL_BENCH_PG_FSYNC=on``
turns it on): on the shared test disks one fsync costs ~5 ms, which caps a durable
source below W1's 1,000 txn/s.  This flatters PostgreSQL on durability — txrepl's
publication log fsyncs every append — and docs/benchmarks.md says so.

PostgreSQL's own logical replication between two clusters: :func:`native_subscribe`
creates a publication on the source and a subscription with ``copy_data = false`` on
the target; ``enabled`` toggles it for catch-up runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from tests.fixtures.postgres import PgServer, pg_available
from tests.support.workload import PG_SCHEMA

__all__ = [
    "BENCH_SETTINGS",
    "NativeReplication",
    "bench_cluster",
    "native_subscribe",
    "pg_reason",
    "pg_source",
]

BENCH_SETTINGS: dict[str, str | int] = {
    "fsync": "on" if os.environ.get("TXREPL_BENCH_PG_FSYNC", "off") == "on" else "off",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "'128MB'",
    "wal_writer_delay": "'10ms'",
}


def pg_reason() -> str | None:
    """None when private clusters can be started here, else why not."""
    reason = pg_available()
    if reason is not None:
        return reason
    try:
        import psycopg  # noqa: F401
    except ImportError as e:  # pragma: no cover - a dependency of txrepl
        return f"psycopg is not installed: {e}"
    return None


@contextlib.contextmanager
def bench_cluster(**settings: str | int) -> Iterator[PgServer]:
    """A private cluster with BENCH_SETTINGS (overridable); stopped and removed on exit."""
    from tests.fixtures.postgres import start_pg_instance

    reason = pg_reason()
    if reason is not None:
        raise RuntimeError(reason)
    merged: dict[str, str | int] = {**BENCH_SETTINGS, **settings}
    with start_pg_instance(None, **merged) as server:  # type: ignore[arg-type]
        yield server


def pg_source(dsn: str) -> Any:
    """A psycopg connection to ``dsn`` with the W1 schema created (autocommit)."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(PG_SCHEMA)
    return conn


class NativeReplication:
    """PostgreSQL's own publication/subscription pair for one source and target database."""

    def __init__(self, source_dsn: str, target_dsn: str, name: str) -> None:
        self.source_dsn = source_dsn
        self.target_dsn = target_dsn
        self.name = name

    def _target(self) -> Any:
        import psycopg

        return psycopg.connect(self.target_dsn, autocommit=True)

    def set_enabled(self, enabled: bool) -> None:
        with self._target() as conn:
            verb = "ENABLE" if enabled else "DISABLE"
            conn.execute(f"ALTER SUBSCRIPTION {self.name} {verb}")
        if not enabled:
            # DISABLE returns before the apply worker exits; wait until the slot is free
            # so the backlog really accumulates on the source.
            self.wait_slot_active(False)

    def wait_slot_active(self, active: bool, timeout: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        with psycopg.connect(self.source_dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.name,)
                ).fetchone()
                if row is not None and bool(row[0]) == active:
                    return
                time.sleep(0.05)
        raise TimeoutError(f"slot {self.name} did not become active={active}")

    def drop(self) -> None:
        with self._target() as conn:
            conn.execute(f"DROP SUBSCRIPTION IF EXISTS {self.name}")


def native_subscribe(
    server_dsn: str, source_dsn: str, target_dsn: str, name: str
) -> NativeReplication:
    """Publication on the source, subscription (copy_data = false) on the target, streaming.

    ``server_dsn`` is a libpq connection string the target cluster uses to reach the
    source (``host=127.0.0.1 port=... dbname=... user=postgres``).
    """
    import psycopg

    with psycopg.connect(source_dsn, autocommit=True) as src:
        src.execute(f"CREATE PUBLICATION {name} FOR TABLE accounts, orders")
    with psycopg.connect(target_dsn, autocommit=True) as dst:
        dst.execute(PG_SCHEMA)
        dst.execute(
            f"CREATE SUBSCRIPTION {name} CONNECTION '{server_dsn}' PUBLICATION {name} "
            "WITH (copy_data = false)"
        )
    rep = NativeReplication(source_dsn, target_dsn, name)
    rep.wait_slot_active(True)
    return rep


def libpq_conninfo(server: PgServer, dbname: str) -> str:
    """The key=value form CREATE SUBSCRIPTION wants."""
    return f"host={server.host} port={server.port} dbname={dbname} user=postgres"
