"""A pipelined batch's statements queued, then sent and read in one go (issue 23).

``_pipeline.py`` sends a small batch's transaction, BEGIN to COMMIT, in psycopg's
pipeline mode: one round trip.  But psycopg talks to the socket once per statement
(each ``execute`` polls, sends that statement and reads what has come), and keeps a
cursor's bookkeeping per statement: for a one-entry W1 batch (ten statements) that
was ~40 % of the apply thread's CPU.  :class:`Queued` takes the same ``execute``
calls, renders each statement and its parameters at once (no I/O), and
:meth:`Queued.run` hands them all to libpq in pipeline mode, sends one Sync, flushes
once and reads the results in order.

**Why it is the same transaction.**  The bytes on the wire are those of psycopg's
pipeline: per statement a Bind/Execute of the extended protocol (a Parse first, or
a prepared statement), then one Sync.  So the server runs the statements in the
order they were queued, the level row is locked before the level guard and before
any row is written, and the first error makes the server skip every later statement
up to the Sync, COMMIT included (the ``_pipeline.py`` docstring has the level
guard's argument, unchanged).  Results come back in the queued order, one set per
statement; the first failed one is raised, as psycopg raises it
(:func:`psycopg.errors.error_from_result`: the same classes and SQLSTATEs), after
every result up to the Sync was read, so the connection leaves pipeline mode clean
and the caller rolls the failed transaction back.

**Parameters** are sent as psycopg sends them on this path: ``str`` as text of
unknown type (the target column's input function parses it, as COPY would), ``int``
as ``int8`` (``numeric`` beyond it), ``bool`` as ``bool``, ``None`` as NULL; the
placeholders are psycopg's (``%s``, ``%(name)s``, ``%%``; a query without
parameters is sent as written).

**Prepared statements.**  A statement text (with its parameter types) seen
:data:`PREPARE_AFTER` times is prepared by a Parse with a name, and executed by
name from then on, as psycopg's automatic preparation did; at most
:data:`PREPARED_MAX` per connection.  A name is remembered only once its Parse's
result says it succeeded: a Parse the server skipped (an earlier statement failed)
or refused leaves nothing to reuse, so a later batch never executes a statement
that does not exist.  The names are per connection (a new one starts with none).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import abc, errors, pq, sql
from psycopg.adapt import Transformer
from psycopg.generators import fetch_many, send

__all__ = ["PREPARED_MAX", "PREPARE_AFTER", "Queued"]

PREPARE_AFTER = 2
PREPARED_MAX = 256

_INT8, _BOOL, _NUMERIC = 20, 16, 1700
_PLACEHOLDER = re.compile(rb"%(?:\(([^)]+)\))?(s|%)")
# The statements prepared by this module, per connection (they die with it).
_PREPARED: weakref.WeakKeyDictionary[psycopg.Connection[Any], Prepared] = (
    weakref.WeakKeyDictionary()
)
_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK, pq.ExecStatus.EMPTY_QUERY)


class Prepared:
    """The statements prepared on one connection, and how often others were seen."""

    def __init__(self) -> None:
        self.names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._seen: dict[tuple[bytes, tuple[int, ...]], int] = {}
        self._made = 0

    def new_name(self) -> bytes:
        """A name never used on this connection (a refused one may exist server-side)."""
        self._made += 1
        return b"_txrepl_%d" % self._made

    def wanted(self, key: tuple[bytes, tuple[int, ...]]) -> bool:
        """Whether ``key`` should be prepared now (seen often enough, room left)."""
        if len(self.names) >= PREPARED_MAX:
            return False
        seen = self._seen.get(key, 0) + 1
        if len(self._seen) >= 4 * PREPARED_MAX:
            self._seen.clear()  # bounded: counts start again
        self._seen[key] = seen
        return seen >= PREPARE_AFTER


def _converted(query: bytes, params: Sequence[Any] | Mapping[str, Any]) -> tuple[bytes, list[Any]]:
    """``query`` with psycopg's placeholders as ``$n``, and the values in ``$n`` order.

    The rewritten text and the order of the parameters depend only on the query's text
    and on whether the parameters are named, so they are made once per statement
    text (:data:`_REWRITTEN`, a regex substitution per statement was ~13 % of the
    apply thread in cProfile) and only the values are picked per call."""
    named = isinstance(params, Mapping)
    key = (query, named)
    got = _REWRITTEN.get(key)
    if got is None:
        got = _rewritten(query, named)
        if len(_REWRITTEN) >= _REWRITTEN_MAX:
            _REWRITTEN.clear()
        _REWRITTEN[key] = got
    text, order = got
    if isinstance(order, int):
        values = list(params)
        if len(values) < order:
            raise TypeError(f"the query has {order} placeholders but {len(values)} parameters")
        return text, values[:order]
    return text, [params[name] for name in order]  # type: ignore[call-overload]


_REWRITTEN: dict[tuple[bytes, bool], tuple[bytes, int | tuple[str, ...]]] = {}
_REWRITTEN_MAX = 4096  # statement texts (a target's tables times a few shapes each)


def _rewritten(query: bytes, named: bool) -> tuple[bytes, int | tuple[str, ...]]:
    """``query`` with ``$n`` placeholders, and what ``$n`` takes: the count of
    positional parameters, or the names in ``$n`` order."""
    names: dict[bytes, int] = {}
    count = 0

    def number(m: re.Match[bytes]) -> bytes:
        nonlocal count
        name, kind = m.group(1), m.group(2)
        if kind == b"%":
            return b"%"
        if name is None:
            if named:
                raise TypeError("a %s placeholder needs a sequence of parameters")
            count += 1
            return b"$%d" % count
        if not named:
            raise TypeError("a %(name)s placeholder needs a mapping of parameters")
        got = names.get(name)
        if got is None:
            got = names[name] = len(names) + 1
        return b"$%d" % got

    text = _PLACEHOLDER.sub(number, query)
    return text, (tuple(n.decode() for n in names) if named else count)


def _dumped(value: Any) -> tuple[bytes | None, int]:
    """A parameter as text and its type oid (module docstring)."""
    if value is None:
        return None, 0
    if isinstance(value, str):
        return value.encode(), 0
    if isinstance(value, bool):
        return (b"t" if value else b"f"), _BOOL
    if isinstance(value, int):
        return str(value).encode(), _INT8 if -(2**63) <= value < 2**63 else _NUMERIC
    raise TypeError(f"no parameter form for {type(value).__name__} here")


class Handle:
    """One queued statement's outcome, once :meth:`Queued.run` has read it."""

    __slots__ = ("_tx", "pgresult")

    def __init__(self, tx: abc.Transformer) -> None:
        self._tx = tx
        self.pgresult: pq.abc.PGresult | None = None

    def fetchone(self) -> tuple[Any, ...] | None:
        """The first row of the statement's result (loaded as psycopg loads it), or None."""
        res = self.pgresult
        if res is None or res.status != pq.ExecStatus.TUPLES_OK or not res.ntuples:
            return None
        self._tx.set_pgresult(res)
        row: tuple[Any, ...] = self._tx.load_row(0, tuple)
        return row


class Queued:
    """The statements of one pipelined transaction, queued by ``execute`` and sent by
    :meth:`run` (module docstring).  Takes the cursor calls made on that path."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.connection = conn
        prepared = _PREPARED.get(conn)
        if prepared is None:
            prepared = _PREPARED[conn] = Prepared()
        self._prepared = prepared
        self._tx: abc.Transformer = Transformer(conn)
        self._sends: list[Callable[[], None]] = []
        # Per result set expected, in order: the handle it belongs to (None: a
        # Parse), and the prepared name to remember if it succeeded.
        self._expect: list[tuple[Handle | None, tuple[bytes, tuple[int, ...]] | None]] = []
        self.last: Handle | None = None  # the handle of the statement queued last

    def execute(self, query: str | bytes | sql.Composable, params: Any = None) -> Handle:
        """Queue ``query`` with ``params``; returns its :class:`Handle`."""
        if isinstance(query, sql.Composable):
            text = query.as_bytes(self.connection)
        else:
            text = query.encode() if isinstance(query, str) else query
        values: list[bytes | None] = []
        types: tuple[int, ...] = ()
        if params is not None:
            text, ordered = _converted(text, params)
            dumped = [_dumped(v) for v in ordered]
            values = [v for v, _ in dumped]
            types = tuple(t for _, t in dumped)
        handle = Handle(self._tx)
        pg = self.connection.pgconn
        key = (text, types)
        name = self._prepared.names.get(key)
        if name is None and self._prepared.wanted(key):
            name = self._prepared.new_name()
            self._sends.append(lambda: pg.send_prepare(name, text, param_types=types))
            self._expect.append((None, key))
            self._prepared.names[key] = name  # provisional: run() drops it if refused
        if name is not None:
            prepared_name = name
            self._sends.append(lambda: pg.send_query_prepared(prepared_name, values))
        else:
            self._sends.append(lambda: pg.send_query_params(text, values, param_types=types))
        self._expect.append((handle, None))
        self.last = handle
        return handle

    def run(self) -> None:
        """Send every queued statement and one Sync, then read every result; raise the
        first error (after the Sync's result was read)."""
        pg = self.connection.pgconn
        sends, expect = self._sends, self._expect
        self._sends, self._expect = [], []
        pg.enter_pipeline_mode()
        try:
            for send_one in sends:
                send_one()
            pg.pipeline_sync()
            got = self.connection.wait(_round_trip(pg, len(expect)))
            pg.exit_pipeline_mode()
        except BaseException:
            for _, key in expect:
                if key is not None:  # nothing known about its Parse
                    self._prepared.names.pop(key, None)
            # Results left unread (a lost connection, an interruption): the
            # connection cannot leave pipeline mode, so it goes.
            self.connection.close()
            raise
        first: psycopg.Error | None = None
        for (handle, key), results in zip(expect, got, strict=True):
            bad = next((r for r in results if r.status not in _OK), None)
            if key is not None and (bad is not None or not results):
                self._prepared.names.pop(key, None)  # skipped or refused: never reused
            if handle is not None and results:
                handle.pgresult = results[-1]
            if bad is not None and first is None and bad.status == pq.ExecStatus.FATAL_ERROR:
                first = errors.error_from_result(bad, encoding=self.connection.info.encoding)
        if first is not None:
            raise first


def _round_trip(pg: pq.abc.PGconn, count: int) -> Any:
    """Flush, then ``count`` result sets and the Sync's (a psycopg generator)."""
    yield from send(pg)
    out = []
    for _ in range(count):
        out.append((yield from fetch_many(pg)))
    sync = yield from fetch_many(pg)
    if not sync or sync[0].status != pq.ExecStatus.PIPELINE_SYNC:
        raise psycopg.OperationalError("the pipeline's results ended before its Sync")
    return out
