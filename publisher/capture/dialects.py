"""The registry of sources: a database URL's dialect -> the Source that captures it.

A new source (MariaDB, say) is one package under ``publisher/capture/`` with a
class implementing :class:`~publisher.capture.source.Source` and an ``open``
factory, plus one line in :data:`SOURCES` (and its scheme in common.dburl).
"""

from __future__ import annotations

from common.dburl import DatabaseUrl, Dialect
from publisher.capture.postgres import PostgresSource
from publisher.capture.source import Source, SourceFactory, SourceOptions
from publisher.capture.sqlite import SqliteSource

__all__ = ["SOURCES", "open_source"]

SOURCES: dict[Dialect, SourceFactory] = {
    "sqlite": SqliteSource.open,
    "postgresql": PostgresSource.open,
}


def open_source(url: DatabaseUrl, options: SourceOptions | None = None) -> Source:
    """Open (and check) the source ``url`` names; SourceError says what is wrong."""
    return SOURCES[url.dialect](url, options or SourceOptions())
