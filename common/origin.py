"""Origins: which node a change was first made on, so that no change comes back to it.

Nodes
=====
A *node* is a database that txrepl both captures from and applies into (or only
one of them), named by one row of ``txrepl_node`` in that database::

    txrepl_node(id = 1, node TEXT)   -- e.g. 'paris'

The publisher records it when it starts (``node`` in its config; default its
``server_name``); if a row is there already, the recorded name is kept, and a
``node`` configured explicitly that disagrees is refused in one line.  A
subscriber reads it from its target (no key of its own): the subscriber of a
database that is also published learns the name the publisher records, whichever
of the two started first, since it reads again until it finds one.  Every
``Entry`` carries ``origin``: the node its changes were first made on.

The rules (docs/topologies.md has the topologies they serve)
============================================================
R1. The publisher gives an entry of changes made on its source by anyone but
    txrepl its own node as origin (``Publication.append``).
R2. txrepl's apply into a node marks its writes with the origin of the entries it
    applies, in the same target transaction, and the capture of that node
    gives the entries of those writes that origin instead of its own:

    * SQLite: the writer holds one row in ``txrepl_applying(since, origin)``
      for the length of its batch transaction (only that connection ever sees
      it, subscriber/targets/sqlite/triggers.py); the capture triggers copy
      ``(SELECT origin FROM txrepl_applying)`` into every capture row (NULL:
      the application's own write), and a poll stops where the origin of the
      rows changes, so a group of entries has one origin.
    * PostgreSQL: the writer's session sets the replication origin
      ``txrepl/<origin>/<subscription>`` (``pg_replication_origin_session_setup``;
      one per subscription, since PostgreSQL lets one session at a time use an
      origin); logical decoding tags the transaction with it (pgoutput's
      Origin message) and the capture reads ``<origin>`` back out of the name.
      A transaction with any other origin (PostgreSQL's own subscriptions) is
      the source's own.
R3. A subscriber whose target is a node applies no entry whose origin is that
    node: such an entry becomes an empty one (its level still moves), so A ⇄ B
    stops after one hop.  A batch holding entries of several origins is written
    as one target transaction per run of one origin, so R2 tags every row with
    its own origin and a chain or a ring (A → B → C → A) carries each change
    round once, to every node but its origin.

Rejected: dropping applied changes at the capture (PostgreSQL's ``origin =
none``): the pair would stop echoing, but a chain A → B → C would never carry
A's changes past B.  Filtering at the publisher's feed: feeds send the log's
bytes unparsed, and the subscriber knows its node, the feed would have to be
told it.
"""

from __future__ import annotations

import re
from typing import Any

from common.errors import PermanentError

__all__ = [
    "APPLYING_TABLE",
    "NODE_TABLE",
    "NodeMismatchError",
    "check_node",
    "claim_node",
    "ensure_applying",
    "node_of_pg_origin",
    "node_table_exists",
    "pg_origin_name",
    "stored_node",
]

NODE_TABLE = "txrepl_node"
APPLYING_TABLE = "txrepl_applying"
_NODE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_PG_PREFIX = "txrepl/"


class NodeMismatchError(PermanentError):
    """The database is recorded as another node than the one configured."""


def check_node(name: str, field: str = "node") -> str:
    """``name`` if it is a valid node name (letters, digits, ``_ . -``), else ValueError."""
    if not _NODE.match(name):
        raise ValueError(
            f"{field} {name!r} is not a valid node name (a letter or _, then letters, "
            "digits, _ . -; at most 128)"
        )
    return name


def _select(dialect: str) -> str:
    if dialect == "sqlite":
        exists = f"(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{NODE_TABLE}')"
    elif dialect == "mariadb":
        exists = (
            "(SELECT COUNT(*) FROM information_schema.tables"
            f" WHERE table_schema = DATABASE() AND table_name = '{NODE_TABLE}')"
        )
    else:
        exists = f"(SELECT to_regclass('{NODE_TABLE}') IS NOT NULL)"
    return f"SELECT CASE WHEN {exists} THEN 1 ELSE 0 END"


def node_table_exists(conn: Any, dialect: str) -> bool:
    """Whether ``conn``'s database has a ``txrepl_node`` table (changes nothing)."""
    (present,) = conn.execute(_select(dialect)).fetchone()
    return bool(present)


def stored_node(conn: Any, dialect: str) -> str:
    """The node ``conn``'s database is recorded as; "" if none (changes nothing)."""
    (present,) = conn.execute(_select(dialect)).fetchone()
    if not present:
        return ""
    row = conn.execute(f"SELECT node FROM {NODE_TABLE} WHERE id = 1").fetchone()
    return str(row[0]) if row else ""


def claim_node(
    conn: Any, dialect: str, configured: str, default: str, *, record: bool = True
) -> str:
    """Record the node ``conn``'s database is (in the caller's transaction); its name.

    ``configured``: the name set in the config ("" if none); ``default``: the name
    to record when none is configured and none is recorded yet.  ``record=False``:
    only check (NodeMismatchError), writing nothing.
    """
    stored = stored_node(conn, dialect)
    if stored:
        if configured and configured != stored:
            raise NodeMismatchError(
                f"the database is recorded as node {stored!r} ({NODE_TABLE}) but the config "
                f"says node = {configured!r}: set node = {stored!r}, or change the row of "
                f"{NODE_TABLE} if the database really is another node now"
            )
        return stored
    name = check_node(configured or default)
    if not record:
        return name
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {NODE_TABLE} "
        "(id INTEGER PRIMARY KEY CHECK (id = 1), node TEXT NOT NULL)"
    )
    conn.execute(f"INSERT INTO {NODE_TABLE} (id, node) VALUES (1, '{name}')")  # checked name
    return name


def ensure_applying(conn: Any) -> None:
    """SQLite: create ``txrepl_applying`` with its ``origin`` column (R2), or add the column.

    Both daemons call it: the capture triggers read the table even on a database
    no subscriber writes into (it stays empty there).
    """
    conn.execute(f"CREATE TABLE IF NOT EXISTS {APPLYING_TABLE} (since TEXT NOT NULL, origin TEXT)")
    cols = {r[1] for r in conn.execute(f"PRAGMA table_info({APPLYING_TABLE})")}
    if "origin" not in cols:  # made by an earlier build
        conn.execute(f"ALTER TABLE {APPLYING_TABLE} ADD COLUMN origin TEXT")


def pg_origin_name(origin: str, subscription: str) -> str:
    """The PostgreSQL replication origin of ``subscription``'s writes of ``origin``'s changes."""
    return f"{_PG_PREFIX}{origin}/{subscription}"


def node_of_pg_origin(name: str) -> str:
    """The node a replication origin name stands for; "" if it is not one of txrepl's."""
    if not name.startswith(_PG_PREFIX):
        return ""
    node = name[len(_PG_PREFIX) :].split("/", 1)[0]
    return node if _NODE.match(node) else ""
