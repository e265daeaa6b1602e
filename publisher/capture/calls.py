"""Procedure calls in the captured stream: which publication records a call, and hides
what (issue 25; the marks and their format: ``common/calls.py``).

Within one source transaction capture meets, in the order they were written: a
**begin mark** (the call), the procedure's own row changes, the **end mark**.  For
each publication a :class:`CallScope` keeps the calls open in the transaction:

* A begin mark is **recorded** (a ``call`` op appended to the publication's ops of
  the transaction, where the mark stood) when the publication lists the procedure in
  ``procedures``, no enclosing call is recorded for it already, and the publication
  is *ready*: every one of its tables was installed (snapshot taken) before the
  call, so no copy of a table already holds the call's effects.
* While a recorded call is open, the publication's **row changes are hidden**: the
  subscriber gets the call instead and its own procedure makes them.  A nested call
  inside a recorded one is neither recorded nor shown (the outer call makes it).
* A call the publication does not record hides nothing: its row changes travel as
  rows, as for any other write (a publication without the procedure, a call made
  while a table was being installed, a begin mark that cannot be parsed: logged).

Ordering and atomicity.  The marks are written in the caller's transaction (a
logical decoding message with ``transactional = true`` is decoded inside its
transaction at its LSN, between the changes written before and after it; a capture
row gets the next AUTOINCREMENT id, SQLite serialising writers), so the call op
lands in the publication's ops exactly between the row changes made before the call
and those made after it, in the entry (or group of fragments) of that one
transaction, appended once (invariants 1-2: the marks travel the same path as the
rows).  The subscriber applies a call as a barrier, in order, inside the batch's
target transaction (``subscriber/apply``).  A call that raised was rolled back to
the savepoint with its marks: nothing of it is captured.  Restarts resume capture
at a transaction boundary, where no call is open: scopes start empty per
transaction (PostgreSQL) or per poll (SQLite: a poll reads whole transactions).

What the target then holds equals the source when the subscriber's procedure does
what the source's did given the same rows: the same-named procedure, or a handler,
as Virtuoso asks.  Rejected: a session or transaction-local GUC read by capture
(logical decoding sees no GUCs) and marking the procedure's tables in a side table
(another write per row, and the marks still needed for order).
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from common.calls import parse_call
from common.rpc import txrepl_pb2 as pb

__all__ = ["CallScope", "read_call"]

log = structlog.get_logger(__name__)


def read_call(text: object) -> pb.ProcedureCall | None:
    """A begin mark's call, or None (logged) when it cannot be read: then it is
    recorded nowhere and hides nothing, so its row changes travel as rows."""
    try:
        if not isinstance(text, str | bytes):
            raise ValueError(f"a {type(text).__name__}, not text")
        return parse_call(text)
    except ValueError as e:  # UnicodeDecodeError is one too
        log.error("capture: procedure call mark unreadable; its rows are published", error=str(e))
        return None


class CallScope:
    """One publication's calls open in one transaction (the module docstring)."""

    __slots__ = ("_open", "procedures")

    def __init__(self, procedures: Iterable[str]) -> None:
        self.procedures = frozenset(procedures)
        self._open: list[bool] = []  # per open call: recorded for this publication

    @property
    def hiding(self) -> bool:
        """A recorded call is open: this publication's row changes are its effects."""
        return any(self._open)

    def begin(self, call: pb.ProcedureCall | None, ready: bool) -> bool:
        """A begin mark; True when this publication records the call."""
        record = call is not None and ready and call.name in self.procedures and not self.hiding
        self._open.append(record)
        return record

    def end(self) -> None:
        if self._open:
            self._open.pop()
