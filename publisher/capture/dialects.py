"""The registry of sources: a database URL's dialect -> the Source that captures it.

A new source is one package under ``publisher/capture/`` with a
class implementing :class:`~publisher.capture.source.Source` and an ``open``
factory, plus one line in :data:`SOURCES` (and its scheme in common.dburl).
"""

from __future__ import annotations

from common.dburl import DatabaseUrl, Dialect
from publisher.capture.source import Source, SourceFactory, SourceOptions

__all__ = ["SOURCES", "open_source"]


# Each source's package is imported when a URL names it: a SQLite publisher does not
# load psycopg and psycopg2 (0.3-1.6 s of a publisher's start, issue 23).
def _sqlite(url: DatabaseUrl, options: SourceOptions) -> Source:
    from publisher.capture.sqlite import SqliteSource

    return SqliteSource.open(url, options)


def _postgresql(url: DatabaseUrl, options: SourceOptions) -> Source:
    from publisher.capture.postgres import PostgresSource

    return PostgresSource.open(url, options)


def _mariadb(url: DatabaseUrl, options: SourceOptions) -> Source:
    from publisher.capture.mariadb import MariadbSource

    return MariadbSource.open(url, options)


SOURCES: dict[Dialect, SourceFactory] = {
    "sqlite": _sqlite,
    "postgresql": _postgresql,
    "mariadb": _mariadb,
}


def open_source(url: DatabaseUrl, options: SourceOptions | None = None) -> Source:
    """Open (and check) the source ``url`` names; SourceError says what is wrong."""
    return SOURCES[url.dialect](url, options or SourceOptions())
