"""The PostgreSQL writer's replication origin: its writes tagged with their origin.

``common/origin.py`` has the rules (R2).  Before a batch's statements, in the batch's
transaction, the writer's session takes the replication origin
``txrepl/<origin>/<subscription>`` of the entries it applies (created the first
time); logical decoding then tags the transaction with it, and the capture of a
publisher on this database reads ``<origin>`` back.  The origin stays set on the
session while the batches keep coming from the same node, so a steady stream
costs nothing more; it is reset (``pg_replication_origin_session_reset``) for a
batch of another origin or of none, and forgotten with a lost connection or a
failed transaction.  One origin per subscription: PostgreSQL lets only one
session at a time use an origin, and two subscriptions write at once.

Needs superuser, or EXECUTE on the ``pg_replication_origin_*`` functions granted
to the writer's role (PostgreSQL restricts them by default).
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from common.origin import pg_origin_name

__all__ = ["SessionOrigin"]

# Gives the transaction a commit time: with an origin set, decoding reports the
# origin's timestamp as the commit time, 0 unless set here (per transaction).
_STAMP = "pg_replication_origin_xact_setup('0/0', now())"


class SessionOrigin:
    """The replication origin set on one writer connection."""

    def __init__(self) -> None:
        self._set: tuple[int, str] | None = None  # (backend pid, origin name)

    def use(self, cur: psycopg.Cursor[Any], subscription: str, origin: str) -> str:
        """Make the session's origin the one of ``origin`` ("": none), in ``cur``'s
        transaction.  Returns the SQL expression the caller selects in the same
        transaction (with its other settings, one statement) to stamp it, or ""."""
        pid = cur.connection.info.backend_pid
        wanted = pg_origin_name(origin, subscription) if origin else ""
        now = self._set[1] if self._set is not None and self._set[0] == pid else ""
        if wanted == now:
            return _STAMP if wanted else ""
        self._set = None
        if now:
            cur.execute("SELECT pg_replication_origin_session_reset()")
        if wanted:
            cur.execute(
                "SELECT pg_replication_origin_create(%s)"
                " WHERE pg_replication_origin_oid(%s) IS NULL",
                (wanted, wanted),
            )
            cur.execute("SELECT pg_replication_origin_session_setup(%s)", (wanted,))
            self._set = (pid, wanted)
            return _STAMP
        return ""

    def forget(self, conn: psycopg.Connection[Any] | None) -> None:
        """The transaction failed: reset the session's origin if it can be, and forget it."""
        if self._set is not None and conn is not None and not (conn.closed or conn.broken):
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_replication_origin_session_reset()")
        self._set = None
