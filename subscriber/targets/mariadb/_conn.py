"""Connections to a MariaDB target: the URL, the apply session's settings, error translation.

``mariadb://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?unix_socket=PATH]`` (also
``mysql://``).  Every connection of the writer and of the snapshot loader runs with:

* ``sql_mode`` = ``ANSI_QUOTES,STRICT_ALL_TABLES,NO_ZERO_DATE,...``: identifiers are
  quoted with double quotes, as on the other targets (``common.names.quote_ident``;
  replicated SQL from a PostgreSQL source reads the same), and a value a column
  cannot hold is an error, never a silent truncation;
* ``time_zone = '+00:00'``: DATETIME values are written and read as UTC;
* ``foreign_key_checks = 0``: the replica role's counterpart (subscriber/apply/_order.py:
  foreign keys are the source's business, its cascades arrive as rows);
* ``@txrepl_applying = 1``: MariaDB has no replica role that silences triggers, so the
  target's triggers fire for replicated rows; a trigger that must not (an audit row,
  a derived table that also arrives by replication) tests this variable
  (``IF @txrepl_applying IS NULL THEN ... END IF``): docs/apply.md, "MariaDB".
* ``autocommit = 0`` and ``READ COMMITTED``: the level row's ``SELECT ... FOR UPDATE``
  serialises writers, and gap locks of REPEATABLE READ would only add deadlocks.

Errors: lost connections, deadlocks and lock wait timeouts are transient (the applier
retries them, on a new connection); everything else is the target refusing the batch.
"""

from __future__ import annotations

from typing import Any

import pymysql

from common.dburl import DatabaseUrl, mariadb_params

__all__ = ["SESSION", "connect", "connect_args", "is_transient"]

SQL_MODE = (
    "ANSI_QUOTES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION,PIPES_AS_CONCAT"
)
SESSION = (
    f"SET SESSION sql_mode = '{SQL_MODE}', time_zone = '+00:00', foreign_key_checks = 0,"
    " tx_isolation = 'READ-COMMITTED', @txrepl_applying = 1"
)

# Server errors worth a retry: lock wait timeout, deadlock, server shutting down, and
# the client's own "lost connection" / "gone away" / "can't connect".
_TRANSIENT = {1205, 1213, 1053, 2003, 2006, 2013, 2055}


def connect_args(url: DatabaseUrl | str) -> dict[str, Any]:
    """PyMySQL's keyword arguments for ``url``; a ValueError names what is missing."""
    return {
        **mariadb_params(url),
        "charset": "utf8mb4",
        "autocommit": False,
        "local_infile": True,
        "init_command": SESSION,
    }


def connect(url: DatabaseUrl | str) -> pymysql.connections.Connection[Any]:
    """A connection with the apply session's settings (module docstring)."""
    return pymysql.connect(**connect_args(url))


def is_transient(exc: BaseException) -> bool:
    """Whether a driver error is worth a retry on a new connection."""
    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    if isinstance(exc, pymysql.err.MySQLError) and exc.args:
        code = exc.args[0]
        return isinstance(code, int) and code in _TRANSIENT
    return False


class Executor:
    """A PyMySQL cursor whose ``execute`` returns the cursor (the DB-API shape
    subscriber.targets.metadata expects)."""

    def __init__(self, cur: pymysql.cursors.Cursor) -> None:
        self.cur = cur

    def execute(self, query: Any, params: Any = None, /) -> pymysql.cursors.Cursor:
        self.cur.execute(query, params)
        return self.cur
