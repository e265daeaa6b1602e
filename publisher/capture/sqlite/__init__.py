"""SQLite source: trigger capture into a capture table (the embedded default).

``capture.py`` installs triggers and turns captured rows into entries (its
docstring has the order and exactly-once argument); ``source.py`` is the
:class:`~publisher.capture.source.Source` over it: the polling stream and
snapshots pinned at an exact seq.
"""

from publisher.capture.sqlite.capture import CapturedRow, SqliteCapture, parse_sql_literal
from publisher.capture.sqlite.source import SqliteSource

__all__ = ["CapturedRow", "SqliteCapture", "SqliteSource", "parse_sql_literal"]
