"""Schema changes on a PostgreSQL source: when the log needs a copy of the table.

A relation message (wal2json: a changed column list) tells the capture a table's
columns changed; the schema op logged before the next row makes the target follow
the shape.  The shape alone is not enough for the rows the change did not write:

* ``ADD COLUMN c ... DEFAULT d`` fills the existing rows without one row change in
  the WAL (a constant default is kept in the catalog, ``pg_attribute.attmissingval``;
  a volatile one rewrites the table, and a rewrite is not decoded either);
* ``RENAME COLUMN a TO b`` looks, in the columns, like a drop of ``a`` and an add of
  ``b`` whose values are ``a``'s;
* ``ALTER COLUMN ... TYPE ... USING expr`` rewrites every row, again undecoded.

In each case the values only the source knows reach the log as a **copy of the
table**: the capture asks for a snapshot of it, exactly as when the table was
installed (``_core.CaptureCore._begin_snapshot``), and logs the table's schema, a
TRUNCATE and its rows at that snapshot's consistent point ``C``.  The rule:

    a copy is needed iff some column of the new shape is not in the old one
    (by name) and either some old column is gone (it may be a rename) or the
    added column has a default or a missing value in the catalog; or some column
    kept its name and changed type.

So ``DROP COLUMN`` alone, ``ADD COLUMN`` with no default (the existing rows are
NULL, which is what the target gives a new column), and NOT NULL or key changes cost
nothing more than the schema op.  The catalog is read when the change is decoded
(the current catalog, not the historic one; see ``_pgcatalog``): a default added
since by ``ALTER COLUMN ... SET DEFAULT`` only costs an unneeded copy.

Between the schema op (at the decoded ALTER, position ``P``) and ``C`` the table's
changes keep being logged in their transactions (no source transaction is split);
only rows untouched since ``P`` may show the target's NULL (or old value) in the
changed column until the copy lands at ``C``, which is the decoding lag, usually
milliseconds.  The request for the copy is written to ``_txrepl.installs`` (the
table's snapshot is reset, as a re-install does) before the slot is confirmed past
the ALTER, so a publisher restart in between takes the copy when it starts; the
table's changes between that restart and its ``C`` are then left out, as during an
install, since the copy carries them.

A copy read under a snapshot older than a later rewrite of the table would read it
as empty (rewrites are not MVCC-safe): ``_stale.check_fresh`` refuses it
(``StaleSnapshot``) and the session takes a new snapshot of the table.

A DDL with no later row change of the table (PostgreSQL sends a relation message
before a change, never on DDL itself) is noticed by ``_ddlwatch.py`` within about a
second; an event trigger would see it at once but needs a superuser.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import structlog

from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres._core import CaptureCore

__all__ = ["needs_copy", "request_copy"]

log = structlog.get_logger(__name__)


def _type(c: pb.Column) -> tuple[object, ...]:
    return (c.type, c.precision, c.scale, c.source_type, c.pg_type)


def needs_copy(
    old: pb.TableSchema,
    new: pb.TableSchema,
    filled: Callable[[Collection[str]], Collection[str]],
) -> bool:
    """Whether changing ``old`` into ``new`` leaves rows whose values are not in the WAL.

    ``filled(names)``: those of the added columns ``names`` that have a default or a
    missing value in the source's catalog (asked only when it matters).
    """
    before = {c.name: c for c in old.columns}
    after = {c.name: c for c in new.columns}
    if any(_type(c) != _type(before[n]) for n, c in after.items() if n in before):
        return True
    added = [n for n in after if n not in before]
    if not added:
        return False
    if any(n not in after for n in before):
        return True  # maybe a rename: the new name's values are the old one's
    return bool(filled(added))


def request_copy(cap: CaptureCore, pub: str, table: str) -> None:
    """Make the table's next snapshot due, durably: before the slot moves past the change."""
    conn = cap._admin()
    with cap._lock:
        conn.execute(
            "UPDATE _txrepl.installs SET snapshot_lsn = NULL, done = false"
            " WHERE slot = %s AND publication = %s AND tbl = %s",
            (cap.slot, pub, table),
        )
    log.info("schema change: table copy requested", publication=pub, table=table)
