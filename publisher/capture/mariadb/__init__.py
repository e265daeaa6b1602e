"""MariaDB source: the binary log, read through ``mysql-replication``.

Modules: ``source.py`` (MariadbSource, the Source protocol), ``_stream.py`` (one
binary-log connection: transactions to entries, install snapshots), ``_gtid.py``
(GTIDs as positions, snapshots pinned at a GTID), ``_catalog.py`` (shapes, checks,
``txrepl_installs``), ``_types.py`` (MariaDB types and values -> the wire).

The server must write a row-based binary log with full images and column names:
``log_bin``, ``binlog_format=ROW``, ``binlog_row_image=FULL``,
``binlog_row_metadata=FULL``; and its GTIDs must be in one replication domain
(``gtid_strict_mode`` recommended).  The source refuses to open otherwise, in one line,
and on a MySQL server (its GTIDs are ``uuid:n`` sets, not read here yet).
The binary log is read as a replica reads it (``COM_BINLOG_DUMP`` with
``@slave_connect_state``), so the user needs ``REPLICATION SLAVE`` and
``REPLICATION CLIENT`` (``BINLOG MONITOR`` on MariaDB 10.5+) besides ``SELECT``.

How it works
============
* Positions.  A transaction's position is its GTID ``domain-server-seq`` as the
  integer ``seq << 32 | server`` (_gtid.py): within the one domain, binary-log order
  is commit order and ``seq`` grows along it.  Each transaction of the source
  database becomes at most ONE entry per publication holding one of its tables
  (several past ``max_entry_bytes``: fragments, ``common/fragments.py``), with
  ``source_position`` = its position; a transaction that holds nothing for a
  publication only advances that publication's position in memory.
* Exactly once, across restarts.  The position is recorded WITH the entry, in the
  entry itself, in the same append: the log is the one record of how far capture
  got, so there is no second place that could disagree with it after a crash.
  A session starts the binary log after the LOWEST position among its
  publications' logs (each log's newest durable entry: ``Publication.position``)
  and each publication skips every transaction at or below its own position.  Each
  log receives whole transactions in binary-log order, so every log holds a prefix
  of the stream: a crash loses only appends that were not durable, and those
  transactions are read again; none is appended twice, since a durable one is at or
  below the position the next session starts from.  A group cut by a crash is
  closed as aborted when its log is opened (``Publication.abort_group``) and its
  transaction read again.  The binary log itself is never consumed, so nothing is
  confirmed to the server; what the server purges (``expire_logs_days``) it must
  not purge before capture has passed it (a position no longer there fails the
  session with the server's message).
* Existing rows (snapshot alignment).  ``install`` checks each table (it exists, has
  a primary key, is InnoDB, every column has a mapping: _types.py) and records it in
  ``txrepl_installs`` as pending.  The session pins one consistent snapshot for all
  pending tables (``START TRANSACTION WITH CONSISTENT SNAPSHOT``; MariaDB reports the
  binary-log offset it matches, turned into a GTID position G by
  ``BINLOG_GTID_POS``: every transaction at or below G is visible in it, none after).
  Until the stream has dealt with G, changes of pending tables are not logged (the
  snapshot holds them); once it has (G's own commit, or the start when the stream
  begins at G), and before any later transaction, each pending table's schema op, a
  TRUNCATE and its rows are appended as one group at position G; from then on the
  table's changes are logged.  ``txrepl_installs`` records G after the group is
  durable.  A crash in between takes the snapshot again at a later G'; its leading
  TRUNCATE clears the earlier rows on the target and the rows as of G' include every
  change in between, so the target still ends equal to the source.
* Schema.  A table's schema op precedes its first row in each publication's log in a
  session, and a row whose binary-log columns (their names, from
  ``binlog_row_metadata=FULL``) differ from the shape capture holds makes capture
  read the shape again and log it first.  Not carried yet (docs/mariadb.md): a
  column type change alone, and an ADD COLUMN's default for rows no change touches.
* On-demand snapshots: source.py.
"""

from __future__ import annotations

from publisher.errors import SourceError

try:
    import pymysqlreplication  # noqa: F401
except ImportError:  # pragma: no cover - exercised by an install without the extra
    raise SourceError(
        "a MariaDB source needs the mysql-replication package: pip install 'txrepl[mariadb]'"
    ) from None

from publisher.capture.mariadb.source import MariadbSource

__all__ = ["MariadbSource"]
