"""Python handlers for replayed procedure calls (``Op.call``), by entry point.

A package registers a handler under the entry point group ``txrepl.procedures``::

    [project.entry-points."txrepl.procedures"]
    "billing.close_period" = "mypkg.replay:close_period"

A handler is called inside the batch's target transaction, in order with the rows
around it, as ``handler(target, *args)``: ``target`` is the writer's open
connection (``sqlite3.Connection``) or cursor (``psycopg.Cursor``), ``args`` the
call's input arguments as ``common.values`` Python objects.  It must not commit.
A name without a handler is, on PostgreSQL, ``CALL name(args)``; on SQLite an error.

It lives beside the targets, not in the apply: the apply only carries a call as a
``CallStep``; each target's writer looks its handler up here and runs it on its
own connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

__all__ = ["GROUP", "Procedure", "load_procedures"]

GROUP = "txrepl.procedures"
Procedure = Callable[..., Any]


def load_procedures(extra: Mapping[str, Procedure] | None = None) -> dict[str, Procedure]:
    """The handlers registered by entry point, overridden by ``extra``."""
    found: dict[str, Procedure] = {ep.name: ep.load() for ep in entry_points(group=GROUP)}
    found.update(extra or {})
    return found
