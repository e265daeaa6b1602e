"""PostgreSQL source: log-based capture through logical decoding on a slot.

Modules: ``capture.py`` (PostgresCapture: the core plus the reconnecting
stream), ``_core.py`` (connections, health, installation, exported snapshots),
``_session.py`` (one replication connection's streaming, the flusher;
``_confirm.py``: its appends, flushes and slot confirmations),
``_state.py`` (run-time values), ``_pgoutput.py`` / ``_pgwal2json.py`` (the
two decoders), ``_pgcatalog.py`` / ``_pgtypes.py`` (shapes and values), and
``source.py`` (PostgresSource, the Source protocol over it).

How it works
============
One **replication slot** per publisher source (named by the configuration, created by
the publisher with the ``pgoutput`` plugin, or ``wal2json``) streams every committed
transaction, whole and in commit order.  For pgoutput the publisher also owns a
PostgreSQL publication ``txrepl_<slot>`` holding every published table.  What is
installed lives in the source, in ``_txrepl.installs`` (one row per slot, publication
and table: the log incarnation, the LSN of the table's snapshot, the schema last logged).

* Entries.  A decoded transaction becomes ONE entry in each publication that has a
  table it touched (a transaction touching two publications makes two entries), with
  ``source_position`` = its commit LSN (where the commit record starts, the order of
  commits), appended through ``Publication.append``.
* Full rows.  Installation sets ``REPLICA IDENTITY FULL`` on each published table, so
  updates and deletes carry the whole old row; an unchanged TOASTed value (pgoutput
  sends ``u``, wal2json leaves the column out) is taken from that old row.
* Exactly once.  The slot's confirmed flush LSN moves to a transaction's end only after
  its entries are durable in every publication log (``Log.flush()`` before each status
  update).  On restart the slot replays from its confirmed position and each
  publication skips transactions whose commit LSN is ``<=`` its ``position`` (the
  position of its log's newest entry).  Each log receives transactions in commit order
  and a transaction is appended to all its publications before the next is looked at,
  so every log holds a prefix of the stream: nothing lost, nothing doubled.
  A transaction's entries are appended without waiting for their fsync
  (``wait=False``); a flusher thread of the session makes them durable, and so visible
  to feeds, in rounds that take whatever was appended meanwhile, while decoding goes
  on.  So one fsync no longer costs every transaction (group commit across
  transactions), and nothing is sent that is not durable: a log's readers see only
  its durable head.  A schema recorded in ``_txrepl.installs`` is saved only after the
  entry carrying its schema op is durable.
* Existing rows (snapshot alignment).  Installing a table locks it ``IN SHARE MODE``
  (waiting out in-flight writers), sets the replica identity and adds it to the
  PostgreSQL publication, all in one transaction.  When capture runs it creates a
  temporary slot with an exported snapshot; its consistent point ``C`` splits the
  transactions exactly: those whose commit LSN is ``< C`` are visible in the snapshot,
  those ``>= C`` are decoded (PostgreSQL's own table synchronisation rests on the same
  fact).  ``C`` is recorded in ``_txrepl.installs`` first; then, when the main stream
  reaches ``C`` (the first transaction with commit LSN ``>= C``, or a keepalive at or
  past ``C``), the table's schema op, a TRUNCATE, and its rows read under the exported
  snapshot are appended (entries of at most ``snapshot_chunk_rows`` rows and
  ``max_entry_bytes`` bytes; a single row over that refuses the publication as a
  streamed one does, the table staying incomplete; positions ``C - 2``
  for all but the last, ``C - 1`` for the last), and only from then on are the table's
  streamed changes logged.  A snapshot is complete iff the publication's position is
  ``>= C - 1`` (WAL records start on 8-byte boundaries, so no commit has LSN ``C - 1``
  or ``C - 2``); one cut short by a crash is taken again with a fresh ``C`` (and its
  leading TRUNCATE clears the rows of the partial one on the target).  A publication
  whose log is new (new incarnation, position 0) is snapshotted afresh the same way.
* Schema changes.  Each relation message (wal2json: each change of a table's column
  list) gives the columns and types as of the decoded WAL; when they differ from the
  schema last logged for a publication, a schema op precedes the row that needs it in
  that publication's entry.  The schema last logged is saved to ``_txrepl.installs``
  after the append (a crash in between only repeats an identical schema op).
  A change whose existing rows have values no row change carries (ADD COLUMN with a
  default, RENAME, a type change) also asks for a copy of the table, logged like an
  install snapshot at its consistent point (``_evolve.py``).

* On-demand snapshots (``txrepl subscriber reinit``, publisher/snapshot.py).
  ``PostgresCapture.export_snapshot`` creates a temporary slot with an exported
  snapshot, consistent point ``C``; ``wait_position`` then
  waits until the capture stream reaches ``C`` (the same crossing as above: a
  ``BEGIN`` of a transaction with commit LSN ``>= C``, or a keepalive at or past
  ``C``, with no transaction open) and returns, per publication, the highest seq
  whose entry's position is ``< C`` (``last_before``; positions never decrease
  along a log).  Every transaction committed before ``C``
  is in the log at or below that seq, none after it, so the snapshot's rows are
  exactly the state as of that seq.  An install snapshot logged at ``C'`` (entries
  at ``C' - 2``, ``C' - 1``) falls below that seq iff ``C' <= C``: its rows are then
  as old as or older than the snapshot's.

Limits: a table needs a primary key; the primary key and NOT NULL of a schema op are
read from the current catalog; values of types without a txrepl type travel as text.
"""

from publisher.capture.postgres.capture import Plugin, PostgresCapture
from publisher.capture.postgres.source import PostgresSource

__all__ = ["Plugin", "PostgresCapture", "PostgresSource"]
