"""The SQLite target: a database file written with stdlib ``sqlite3``.

``writer.py`` applies batches (one ``BEGIN IMMEDIATE`` transaction each);
``snapshot.py`` loads a snapshot into shadow tables and swaps them in.  The
registry (:mod:`subscriber.targets`) reaches this package through the three
names below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.dburl import DatabaseUrl
from subscriber.targets.sqlite.snapshot import SqliteSnapshotLoader
from subscriber.targets.sqlite.writer import SqliteWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "SNAPSHOT_NEEDS_SPARK",
    "SqliteSnapshotLoader",
    "SqliteWriter",
    "open_snapshot_loader",
    "open_writer",
]

SNAPSHOT_NEEDS_SPARK = True  # every chunk passes through Spark (the transforms' hook)


def open_writer(url: DatabaseUrl, config: Any = None) -> SqliteWriter:
    """The writer of the file ``url`` names (``config`` has nothing for SQLite)."""
    return SqliteWriter(url.sqlite_path)


def open_snapshot_loader(
    url: DatabaseUrl, *, subscription: str, spark: SparkSession | None, role: str | None = None
) -> SqliteSnapshotLoader:
    """A shadow-table loader into the file (``spark`` required; no roles in SQLite)."""
    return SqliteSnapshotLoader(url.sqlite_path, spark, subscription)
