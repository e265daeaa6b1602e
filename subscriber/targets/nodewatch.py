"""The target's node, read once per batch no more: found once, or known absent (issue 23).

The apply asks its writer for the target's node (``txrepl_node``, common/origin.py)
before each batch, until it finds one: a publisher on the target database may record
it at any time, and from then on the entries of that node must be skipped (R3).  On
a target that is no node, that was a lookup per batch outside the batch's
transaction: two queries, and for PostgreSQL a round trip of its own (half of an
in-sync batch's waits on the server once the batch itself is one round trip,
subscriber/targets/postgres/_pipeline.py).

:class:`NodeWatch` turns it into a check inside the batch's own transaction:

* Once a lookup found no ``txrepl_node`` table, :meth:`NodeWatch.read` answers ""
  without a query (:attr:`NodeWatch.absent`), and every batch planned on that
  answer checks, in its transaction and before its COMMIT, that the table is still
  absent: SQLite reads ``sqlite_master`` after ``BEGIN IMMEDIATE`` (the write lock
  is held, so no publisher can record a node before the COMMIT); PostgreSQL's
  pipelined batch adds ``to_regclass('txrepl_node') IS NULL`` to the statement
  that checks its level (subscriber/targets/postgres/_pipeline.py), which fails
  the transaction when the table is there, and an unpipelined one looks after
  locking the level row.
* When the table has appeared, the batch commits nothing and :class:`NodeAppeared`
  (a :class:`GapError`) goes up to the engine, which reads the node and applies the
  batch again, planned for it (``Applier.apply``).  A table that is present but
  holds no row is looked up per batch, as before.

So a batch is never committed with a node older than its transaction: before, a
node recorded between the lookup and the batch's COMMIT went unseen for that batch.
"""

from __future__ import annotations

from typing import Any

from common.origin import node_table_exists, stored_node
from subscriber.apply.errors import NodeAppeared

__all__ = ["NodeWatch"]


class NodeWatch:
    """One writer's knowledge of its target's node (see the module docstring)."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.absent = False  # no txrepl_node table as of the last look

    def read(self, conn: Any) -> str:
        """The node recorded in ``conn``'s database ("" if none): a query unless the
        table is known absent (the batch's transaction then checks it)."""
        if self.absent:
            return ""
        node = stored_node(conn, self.dialect)
        if not node:
            self.absent = not node_table_exists(conn, self.dialect)
        return node

    def check(self, conn: Any, subscription: str, seq: int) -> None:
        """Inside a batch's transaction: :class:`NodeAppeared` if the table, known
        absent, is there now."""
        if self.absent and node_table_exists(conn, self.dialect):
            self.appeared(subscription, seq)

    def appeared(self, subscription: str, seq: int) -> None:
        self.absent = False
        raise NodeAppeared(
            "the target was recorded as a node since the batch was planned: planning it again",
            subscription=subscription,
            seq=seq,
        )
