"""The ``txrepl_*`` tables every target keeps, and the one code that reads and writes them.

Three tables, in the target database beside the replicated ones::

    txrepl_subscriptions (subscription PK, incarnation, level, updated_at)
        the level row: the seq of the last applied entry, moved in the same
        transaction as the rows of the batch that reached it
    txrepl_schemas (subscription, table_name PK, schema, updated_at)
        the published TableSchema of each table, as the apply last saw it
    txrepl_errors (subscription, seq PK, entry, error, created_at, status)
        entries stored whole because they failed on their own; status
        ``open`` | ``skipped`` | ``applied``

A batch normally runs between :meth:`MetadataSql.open_batch` (lock the level row,
refuse unless it is just before the batch) and :meth:`MetadataSql.close_batch`
(move the level).  A *re-execution* (``reexecute=True``, see
:mod:`subscriber.apply.stored`) is the one exception: it applies a stored,
``skipped`` entry the level has already passed, in its own transaction, under the
same level lock; it leaves the level where it is and marks the entry ``applied``
in that transaction, so a re-execution happens at most once.

A writer (or a snapshot loader) opens the transaction and translates its driver's
errors; the statements and the rules (the level check, what a skip may move) are
here, once, for every dialect.  A dialect gives a :class:`MetadataSql`: its
parameter marks, its SQL for "now", and how it locks the level row (PostgreSQL:
make the row, then ``SELECT ... FOR UPDATE``; SQLite: ``BEGIN IMMEDIATE`` already
holds the database's write lock; MariaDB: PostgreSQL's spelling rewritten by its
``rewrite``).  ``cur`` is anything with a DB-API ``execute``
that returns a cursor (a ``sqlite3.Connection``, a ``psycopg.Cursor``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import ApplyError
from subscriber.apply.writer import StoredError, SubscriptionState, check_level

__all__ = ["Executor", "MetadataSql"]

_NAME = re.compile(r"(?<![:\w]):([a-z_]+)")


class Executor(Protocol):
    """A DB-API connection or cursor: ``execute`` returns a cursor."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


@dataclass(frozen=True)
class MetadataSql:
    """One dialect's spelling of the metadata statements, and the code that runs them.

    ``mark`` formats a named parameter (``":{}"``, ``"%({})s"``); ``now`` is the
    SQL of the current time, or ``":now"`` to pass ``now_value()`` as a
    parameter; ``lock_suffix`` ends the level row's SELECT (``" FOR UPDATE"``);
    ``make_level_row``: insert a level-0 row first, so there is a row to lock;
    ``rewrite``: the dialect's spelling of a statement written as PostgreSQL and
    SQLite spell it (``ON CONFLICT``, ``excluded``), applied last.
    """

    mark: str
    now: str
    lock_suffix: str = ""
    make_level_row: bool = False
    now_value: Callable[[], object] | None = None
    rewrite: Callable[[str], str] | None = None

    def _q(self, text: str) -> str:
        return _spelled(self, text)

    def _run(self, cur: Executor, text: str, params: Mapping[str, object]) -> Any:
        values = dict(params)
        if self.now_value is not None and "{now}" in text:
            values["now"] = self.now_value()
        return cur.execute(self._q(text), values)

    # -- the level row -----------------------------------------------------------

    def load_state(self, cur: Executor, subscription: str) -> SubscriptionState:
        """The stored level, incarnation and schemas (level 0 if none)."""
        p = {"subscription": subscription}
        row = self._run(
            cur,
            "SELECT incarnation, level FROM txrepl_subscriptions"
            " WHERE subscription = :subscription",
            p,
        ).fetchone()
        rows = self._run(
            cur,
            "SELECT table_name, schema FROM txrepl_schemas WHERE subscription = :subscription",
            p,
        ).fetchall()
        schemas = {name: pb.TableSchema.FromString(bytes(blob)) for name, blob in rows}
        if row is None:
            return SubscriptionState(0, "", schemas)
        return SubscriptionState(int(row[1]), str(row[0]), schemas)

    def lock_level(self, cur: Executor, subscription: str) -> tuple[int, str]:
        """(level, incarnation) of the subscription, its row locked for this transaction."""
        return _level_of(self._lock_sent(cur, subscription).fetchone())

    def _lock_sent(self, cur: Executor, subscription: str) -> Any:
        """Send the level row's lock; the cursor whose row is (level, incarnation)."""
        if self.make_level_row:
            self.make_row(cur, subscription)
        return self._run(
            cur,
            "SELECT level, incarnation FROM txrepl_subscriptions"
            " WHERE subscription = :subscription" + self.lock_suffix,
            {"subscription": subscription},
        )

    def make_row(self, cur: Executor, subscription: str) -> None:
        """Make the subscription's level row at level 0 if it has none (so there is a
        row to lock: a second applier of a fresh subscription waits at it)."""
        self._run(
            cur,
            "INSERT INTO txrepl_subscriptions (subscription, incarnation, level)"
            " VALUES (:subscription, '', 0) ON CONFLICT (subscription) DO NOTHING",
            {"subscription": subscription},
        )

    def read_level(self, cur: Executor, subscription: str) -> tuple[int, str]:
        """(level, incarnation) as stored now, unlocked ((0, "") if no row)."""
        return _level_of(
            self._run(
                cur,
                "SELECT level, incarnation FROM txrepl_subscriptions"
                " WHERE subscription = :subscription",
                {"subscription": subscription},
            ).fetchone()
        )

    def set_level(self, cur: Executor, subscription: str, incarnation: str, level: int) -> None:
        self._run(
            cur,
            "INSERT INTO txrepl_subscriptions (subscription, incarnation, level, updated_at)"
            " VALUES (:subscription, :incarnation, :level, {now})"
            " ON CONFLICT (subscription) DO UPDATE SET incarnation = excluded.incarnation,"
            " level = excluded.level, updated_at = excluded.updated_at",
            {"subscription": subscription, "incarnation": incarnation, "level": level},
        )

    def check_and_lock(
        self, cur: Executor, subscription: str, incarnation: str, first_seq: int
    ) -> None:
        """Lock the level row; :class:`GapError` unless it is ``first_seq - 1`` (and the
        incarnation matches)."""
        level, stored = self.lock_level(cur, subscription)
        check_level(subscription, incarnation, first_seq, level, stored)

    def open_batch(
        self, cur: Executor, subscription: str, incarnation: str, first_seq: int, reexecute: bool
    ) -> None:
        """Start a batch's transaction: :meth:`check_and_lock`, or for a re-execution
        lock the level and refuse unless ``first_seq`` is a stored, skipped entry the
        level has passed."""
        if not reexecute:
            self.check_and_lock(cur, subscription, incarnation, first_seq)
            return
        level, _ = self.lock_level(cur, subscription)
        row = self._run(
            cur,
            "SELECT status FROM txrepl_errors WHERE subscription = :subscription AND seq = :seq",
            {"subscription": subscription, "seq": first_seq},
        ).fetchone()
        if row is None or row[0] != "skipped" or level < first_seq:
            raise ApplyError(
                "only a skipped entry the level has passed can be re-executed "
                f"(status {row[0] if row else 'none'}, level {level})",
                subscription=subscription,
                seq=first_seq,
            )

    def close_batch(
        self,
        cur: Executor,
        subscription: str,
        incarnation: str,
        seq_range: tuple[int, int],
        reexecute: bool,
    ) -> None:
        """End a batch's transaction: move the level to the last seq, or for a
        re-execution mark the entry applied and leave the level."""
        if reexecute:
            self.mark_error(cur, subscription, seq_range[0], "applied")
        else:
            self.set_level(cur, subscription, incarnation, seq_range[1])

    # -- schemas -----------------------------------------------------------------

    def record_schema(self, cur: Executor, subscription: str, schema: pb.TableSchema) -> None:
        self._run(
            cur,
            "INSERT INTO txrepl_schemas (subscription, table_name, schema, updated_at)"
            " VALUES (:subscription, :table_name, :schema, {now})"
            " ON CONFLICT (subscription, table_name) DO UPDATE SET"
            " schema = excluded.schema, updated_at = excluded.updated_at",
            {
                "subscription": subscription,
                "table_name": schema.table,
                "schema": schema.SerializeToString(),
            },
        )

    def replace_schemas(
        self, cur: Executor, subscription: str, schemas: Mapping[str, pb.TableSchema]
    ) -> None:
        """The subscription's recorded schemas become ``schemas`` (a snapshot's swap)."""
        self._run(
            cur,
            "DELETE FROM txrepl_schemas WHERE subscription = :subscription",
            {"subscription": subscription},
        )
        for table, schema in schemas.items():
            self._run(
                cur,
                "INSERT INTO txrepl_schemas (subscription, table_name, schema, updated_at)"
                " VALUES (:subscription, :table_name, :schema, {now})",
                {
                    "subscription": subscription,
                    "table_name": table,
                    "schema": schema.SerializeToString(),
                },
            )

    # -- stored errors -----------------------------------------------------------

    def record_error(
        self,
        cur: Executor,
        subscription: str,
        incarnation: str,
        seq: int,
        entry: bytes,
        error: str,
        *,
        skip: bool,
    ) -> None:
        """Store entry ``seq`` (the level must be ``seq - 1``); with ``skip`` move past it."""
        self.check_and_lock(cur, subscription, incarnation, seq)
        self._run(
            cur,
            "INSERT INTO txrepl_errors (subscription, seq, entry, error, created_at, status)"
            " VALUES (:subscription, :seq, :entry, :error, {now}, :status)"
            " ON CONFLICT (subscription, seq) DO UPDATE SET"
            " entry = excluded.entry, error = excluded.error,"
            " created_at = excluded.created_at, status = excluded.status",
            {
                "subscription": subscription,
                "seq": seq,
                "entry": entry,
                "error": error,
                "status": "skipped" if skip else "open",
            },
        )
        if skip:
            self.set_level(cur, subscription, incarnation, seq)

    def list_errors(self, cur: Executor, subscription: str | None) -> list[StoredError]:
        rows = self._run(
            cur,
            "SELECT subscription, seq, entry, error, created_at, status FROM txrepl_errors"
            " WHERE CAST(:subscription AS text) IS NULL OR subscription = :subscription"
            " ORDER BY subscription, seq",
            {"subscription": subscription},
        ).fetchall()
        return [
            StoredError(
                r[0],
                int(r[1]),
                bytes(r[2]),
                r[3],
                r[4] if isinstance(r[4], str) else r[4].isoformat(),
                r[5],
            )
            for r in rows
        ]

    def skip_error(self, cur: Executor, subscription: str, seq: int) -> int:
        """Mark error ``seq`` skipped; move the level to it if it is just before; the level."""
        level, stored = self.lock_level(cur, subscription)
        done = self._run(
            cur,
            "UPDATE txrepl_errors SET status = 'skipped'"
            " WHERE subscription = :subscription AND seq = :seq AND status <> 'applied'",
            {"subscription": subscription, "seq": seq},
        )
        if done.rowcount != 1:  # an applied entry stays applied: it must not run twice
            raise ApplyError("no stored error not yet applied", subscription=subscription, seq=seq)
        if level < seq - 1:
            raise ApplyError(
                f"the level is {level}: entries before {seq} are not applied yet",
                subscription=subscription,
                seq=seq,
            )
        if level == seq - 1:
            self.set_level(cur, subscription, stored, seq)
            return seq
        return level

    def mark_error(self, cur: Executor, subscription: str, seq: int, status: str) -> None:
        self._run(
            cur,
            "UPDATE txrepl_errors SET status = :status"
            " WHERE subscription = :subscription AND seq = :seq",
            {"subscription": subscription, "seq": seq, "status": status},
        )


@functools.lru_cache(maxsize=256)
def _spelled(dialect: MetadataSql, text: str) -> str:
    """``text`` as ``dialect`` spells it: made once per statement, not per batch (the
    substitutions cost ~10 us, and a batch runs two of these statements at least)."""
    text = text.replace("{now}", dialect.now)
    text = _NAME.sub(lambda m: dialect.mark.format(m.group(1)), text)
    return text if dialect.rewrite is None else dialect.rewrite(text)


def _level_of(row: Any) -> tuple[int, str]:
    return (int(row[0]), str(row[1])) if row else (0, "")
