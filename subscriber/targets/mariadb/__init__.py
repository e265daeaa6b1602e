"""The MariaDB / MySQL target: PyMySQL, one InnoDB transaction per batch.

``writer.py`` applies batches (DDL split around the transaction: MariaDB commits it
implicitly); ``_types.py`` maps logical types to MariaDB columns and refuses what it
cannot hold; ``_conn.py`` holds the URL, the apply session's settings (trigger
suppression by ``@txrepl_applying``, no foreign key checks) and error translation;
``snapshot.py`` loads a snapshot into shadow tables and moves it in with the level in
one transaction.  The registry (:mod:`subscriber.targets`) reaches this package
through the names below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.dburl import DatabaseUrl
from subscriber.targets.mariadb.snapshot import MariaSnapshotLoader
from subscriber.targets.mariadb.writer import MariaWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "SNAPSHOT_NEEDS_SPARK",
    "MariaSnapshotLoader",
    "MariaWriter",
    "open_snapshot_loader",
    "open_writer",
]

SNAPSHOT_NEEDS_SPARK = False  # rows go from the driver (Spark only for transforms)


def open_writer(url: DatabaseUrl, config: Any = None) -> MariaWriter:
    """The writer of ``url`` (``config`` has nothing for MariaDB: no replay role)."""
    return MariaWriter(url.raw)


def open_snapshot_loader(
    url: DatabaseUrl, *, subscription: str, spark: SparkSession | None, role: str | None = None
) -> MariaSnapshotLoader:
    """A shadow-table loader into ``url`` (``spark`` and ``role`` unused)."""
    return MariaSnapshotLoader(url.raw, subscription)
