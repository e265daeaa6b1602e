"""The PostgreSQL target: psycopg 3, COPY into staging tables, one transaction per batch.

``writer.py`` applies batches; ``_copy.py`` turns apply tables into COPY's CSV and
column types; ``_jdbc.py`` stages large rows steps through Spark's JDBC writer;
``snapshot.py`` loads a snapshot into shadow tables and swaps them in, in one
transaction.  The registry (:mod:`subscriber.targets`) reaches this package
through the three names below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.dburl import DatabaseUrl
from subscriber.targets.postgres.snapshot import PgShadowLoader, PostgresSnapshotLoader
from subscriber.targets.postgres.writer import PostgresWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "SNAPSHOT_NEEDS_SPARK",
    "PgShadowLoader",
    "PostgresSnapshotLoader",
    "PostgresWriter",
    "open_snapshot_loader",
    "open_writer",
]

SNAPSHOT_NEEDS_SPARK = False  # rows go by COPY from the driver (Spark only for transforms)


def open_writer(url: DatabaseUrl, config: Any = None) -> PostgresWriter:
    """The writer of ``url``; ``config`` (an ``ApplyConfig``) gives the replay role,
    ``session_replication_role`` and ``synchronous_commit``."""
    role = getattr(config, "role", "") or None
    replication_role = getattr(config, "replication_role", "replica")
    synchronous_commit = getattr(config, "synchronous_commit", "off")
    return PostgresWriter(
        url.raw,
        role=role,
        replication_role=replication_role,
        synchronous_commit=synchronous_commit,
    )


def open_snapshot_loader(
    url: DatabaseUrl, *, subscription: str, spark: SparkSession | None, role: str | None = None
) -> PostgresSnapshotLoader:
    """A shadow-table loader into ``url`` (``spark`` unused; ``role``: the replay role
    to create the tables as)."""
    return PostgresSnapshotLoader(url.raw, subscription, role=role)
