"""Capture: turns committed source transactions into publication entries.

::

    source.py      the Source protocol (install, stream, snapshot, release) and
                   the Snapshot and SourceOptions values
    dialects.py    the registry: DatabaseUrl dialect -> Source factory
    thread.py      CaptureThread: a source's stream beside the daemon's loop
    values.py      setting snapshot values in place (the snapshot hot loop)
    sqlite/        trigger capture of a SQLite file
    postgres/      logical decoding of a PostgreSQL slot (pgoutput, wal2json)

The daemon and publisher/snapshot.py know only the protocol; nothing outside
this package names a dialect.
"""

from publisher.capture.source import Snapshot, Source, SourceOptions

__all__ = ["Snapshot", "Source", "SourceOptions"]
