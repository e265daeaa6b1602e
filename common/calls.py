"""Procedure calls captured at the source, in the caller's transaction (issue 25).

Virtuoso's procedure replication: "all calls to this procedure will be recorded in
the publication's log and the same procedure will be called on the subscriber ...
actions performed inside the procedure are not themselves recorded".  An application
makes such a call through this module, inside its own transaction::

    # PostgreSQL (psycopg 3): CALL bump(1, '+'), recorded
    call_procedure(conn, "bump", 1, "+")

    # SQLite (no stored procedures: the procedure is the application's code)
    with captured_call(conn, "bump", 1, "+"):
        bump(conn, 1, "+")

A publication lists the procedures it carries (``[[publication]] procedures``); the
subscriber runs the same-named procedure (PostgreSQL ``CALL``) or its registered
handler (``subscriber/targets/procedures.py``) inside the batch's target transaction,
where the call stood among the source transaction's row changes.  Only input
arguments travel.

The bracket, written in the caller's transaction (a savepoint around it, so a call
that raises leaves neither its marks nor its changes)::

    begin mark   the call: name and typed arguments (below)
    ...          the procedure's own row changes
    end mark

PostgreSQL: the marks are transactional logical decoding messages
(``pg_logical_emit_message(true, 'txrepl.call', <call>)`` and ``(true,
'txrepl.call.end', '')``), decoded in the transaction, in LSN order with its row
changes.  SQLite: they are rows of the capture table (``op`` ``'C'`` with the call in
``v``, then ``'E'``; ``tbl`` the procedure's name), whose ids follow the order of the
writes.  Either way capture sees begin, inner changes, end in the order they were
written, in the one transaction that committed them (``publisher/capture/calls.py``
draws the consequences).

The call's text (one format for both sources and for SQL written by hand) is the
protobuf JSON mapping of ``txrepl.v1.ProcedureCall``: typed, so an exact decimal, a
date or bytes arrive as what they were::

    {"name": "bump", "args": [{"int": "1"}, {"text": "+"}]}
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

from google.protobuf import json_format

from common.errors import PermanentError
from common.rpc import txrepl_pb2 as pb
from common.values import encode

__all__ = [
    "BEGIN_PREFIX",
    "END_PREFIX",
    "CallError",
    "call_procedure",
    "call_text",
    "captured_call",
    "parse_call",
]

BEGIN_PREFIX = "txrepl.call"
END_PREFIX = "txrepl.call.end"
_CAPTURE_TABLE = "_txrepl_capture"  # publisher/capture/sqlite/capture.py


class CallError(PermanentError):
    """A procedure call cannot be recorded (no capture installed, a bad name)."""


def call_text(name: str, *args: object) -> str:
    """The call as the marks carry it (the module docstring)."""
    if not name or name != name.strip():
        raise CallError(f"procedure name {name!r}: empty or padded with spaces")
    call = pb.ProcedureCall(name=name, args=[encode(a) for a in args])
    return json_format.MessageToJson(call, indent=None)


def parse_call(text: str | bytes) -> pb.ProcedureCall:
    """A begin mark's call; ValueError (with the reason) when it is not one."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        call = json_format.Parse(text, pb.ProcedureCall())
    except json_format.ParseError as e:  # not a ValueError
        raise ValueError(str(e)) from None
    if not call.name:
        raise ValueError("the call has no name")
    return call


@contextlib.contextmanager
def captured_call(conn: Any, name: str, *args: object) -> Iterator[None]:
    """Record a call of ``name(args)`` around the body, in ``conn``'s transaction.

    ``conn``: a ``sqlite3.Connection`` on a SQLite source or a ``psycopg.Connection``
    on a PostgreSQL source.  The body's own row changes are not published to the
    publications that carry the call (they carry the call instead).
    """
    text = call_text(name, *args)
    if isinstance(conn, sqlite3.Connection):
        with _sqlite_savepoint(conn):
            _sqlite_mark(conn, name, "C", text)
            yield
            _sqlite_mark(conn, name, "E", None)
        return
    with conn.transaction():  # psycopg: a savepoint inside a transaction, else one
        conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (BEGIN_PREFIX, text))
        yield
        conn.execute("SELECT pg_logical_emit_message(true, %s, '')", (END_PREFIX,))


def call_procedure(conn: Any, name: str, *args: object) -> None:
    """``CALL name(args)`` on a PostgreSQL source, recorded for the subscribers."""
    from psycopg import sql  # only where PostgreSQL is the source

    proc = sql.SQL(".").join(sql.Identifier(p) for p in name.split("."))
    marks = sql.SQL(", ").join(sql.Placeholder() for _ in args)
    with captured_call(conn, name, *args):
        conn.execute(sql.SQL("CALL {}({})").format(proc, marks), list(args))


@contextlib.contextmanager
def _sqlite_savepoint(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("SAVEPOINT txrepl_call")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK TO txrepl_call")
        conn.execute("RELEASE txrepl_call")
        raise
    conn.execute("RELEASE txrepl_call")


def _sqlite_mark(conn: sqlite3.Connection, name: str, op: str, text: str | None) -> None:
    try:
        conn.execute(f"INSERT INTO {_CAPTURE_TABLE}(tbl, op, v) VALUES (?, ?, ?)", (name, op, text))
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            raise CallError(
                f"procedure call {name!r}: this database has no txrepl capture; start the "
                "publisher on it first"
            ) from None
        raise
