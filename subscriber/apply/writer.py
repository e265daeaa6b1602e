"""The target side: what a writer receives, and the :class:`Writer` protocol.

A writer applies one batch as one target transaction: it re-reads the
subscription's level under the target's write lock, refuses a batch that does not
continue it, runs the batch's steps in order, writes the new level row and
commits.  Spark never writes to the target; it only computes the steps' rows.

Rows travel as Arrow tables whose table columns are named by position: ``c{i}``
for the ``i``-th column of the table's schema in its typed Arrow form, or ``v{i}``
when the column had to be carried as *variant* (each cell a serialized
``txrepl.v1.Value``, because some value did not fit the column's declared type).
Positional names keep Spark away from the source's column names (Spark is
case-insensitive; ``_seq`` could clash).  Typed Arrow forms, chosen so that Spark
round-trips them exactly:

===========  =================  ==========================================
ColumnType   Arrow              content
===========  =================  ==========================================
INTEGER      int64
DECIMAL      string             canonical decimal text (unbounded precision)
FLOAT        float64
TEXT, JSON   string
BYTES        binary
BOOLEAN      bool
DATE         date32
TIME         int64              microseconds since midnight
TIMESTAMP    int64              microseconds since 1970-01-01T00:00 (naive)
TIMESTAMPTZ  string             ISO 8601 with the original offset
other        binary (variant)   serialized Value
===========  =================  ==========================================
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from common import values
from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import GapError

__all__ = [
    "CallStep",
    "HistoryStep",
    "RowsStep",
    "SchemaStep",
    "SqlStep",
    "Step",
    "StoredError",
    "SubscriptionState",
    "TruncateStep",
    "Writer",
    "column_of",
    "python_values",
]

T = pb.ColumnType


@dataclass(frozen=True)
class SubscriptionState:
    """What the target remembers about a subscription."""

    level: int = 0
    incarnation: str = ""
    schemas: dict[str, pb.TableSchema] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredError:
    """One row of the target's ``txrepl_errors``: an entry that could not be applied.

    ``status``: ``open`` (the subscription stopped before it), ``skipped`` (the level
    moved past it without applying it) or ``applied`` (a retry applied it, in order
    or re-executed after the level passed it).
    """

    subscription: str
    seq: int
    entry: bytes  # the serialized txrepl.v1.Entry, whole
    error: str
    created_at: str
    status: str


@dataclass(frozen=True)
class SchemaStep:
    """Create the table, or add the columns it lacks, and record the schema.

    ``schema`` is the source's (recorded, keyed by its table name); ``target``, when
    a transform or history mode shapes the target table differently, is what the
    DDL creates.
    """

    schema: pb.TableSchema
    previous: pb.TableSchema | None
    target: pb.TableSchema | None = None


@dataclass(frozen=True)
class TruncateStep:
    """Empty the table; ``cascade``/``restart_identity``: the source's TRUNCATE options."""

    table: str
    cascade: bool = False
    restart_identity: bool = False


@dataclass(frozen=True)
class SqlStep:
    sql: str


@dataclass(frozen=True)
class CallStep:
    name: str
    args: Sequence[pb.Value]


@dataclass(frozen=True)
class RowsStep:
    """Net effect of one segment on one table: keys to delete, rows to upsert.

    Each primary key appears at most once across both tables.
    """

    schema: pb.TableSchema
    deletes: pa.Table
    upserts: pa.Table
    # The first ``fresh`` upserts are of keys whose first event in the segment was
    # a source INSERT: absent from a target that mirrors the source at the
    # segment's start.  A writer may insert them plainly (cheaper than an upsert),
    # but must still upsert them if it finds one present (an INSERT OR REPLACE on
    # a SQLite source, an application's Publish, a target written to by hand).
    fresh: int = 0

    def counts(self) -> tuple[int, int]:
        """(deletes, upserts) rows, without building a table that is built lazily."""
        return int(self.deletes.num_rows), int(self.upserts.num_rows)

    def columns(self, upserts: bool, indexes: list[int]) -> list[list[Any]] | None:
        """The schema columns ``indexes`` of the upserts (else the deletes) as plain
        values, each list what the Arrow column's ``to_pylist`` gives; None: read the
        Arrow tables (``_plain.py`` keeps a few rows this way)."""
        return None


@dataclass(frozen=True)
class HistoryStep:
    """History mode: close each key's open version, then insert the segment's versions.

    ``schema`` is the history table's (source columns, then ``_first_seq``,
    ``_last_seq``, ``_op``, ``_commit_time``; key = source key + ``_first_seq``);
    ``versions`` holds its columns positionally plus ``_first`` (bool: the key's
    earliest version in the segment, whose ``_first_seq - 1`` closes the open one).
    """

    schema: pb.TableSchema
    versions: pa.Table


Step = SchemaStep | TruncateStep | SqlStep | CallStep | RowsStep | HistoryStep


class Writer(Protocol):
    """A target database.  One :meth:`write` is one target transaction."""

    dialect: str

    def load_state(self, subscription: str) -> SubscriptionState:
        """The stored level, incarnation and table schemas (level 0 if new)."""
        ...

    def write(
        self,
        subscription: str,
        incarnation: str,
        first_seq: int,
        last_seq: int,
        steps: Sequence[Step],
        *,
        reexecute: bool = False,
    ) -> int:
        """Apply ``steps`` and move the level to ``last_seq``, atomically.

        Raises :class:`GapError` (changing nothing) unless the stored level is
        ``first_seq - 1`` and the stored incarnation is empty or ``incarnation``.
        Returns the number of target rows deleted or upserted.  ``reexecute``:
        ``first_seq`` is a stored, skipped entry the level has passed; apply it and
        mark it ``applied`` instead of moving the level (subscriber.apply.stored).
        """
        ...

    def record_error(
        self,
        subscription: str,
        incarnation: str,
        seq: int,
        entry: bytes,
        error: str,
        *,
        skip: bool,
    ) -> None:
        """Store entry ``seq`` in ``txrepl_errors``; with ``skip`` also move the level to it.

        One transaction, under the level lock; raises :class:`GapError` unless the
        level is ``seq - 1`` (so the error is recorded exactly where the
        subscription stands).
        """
        ...

    def list_errors(self, subscription: str | None = None) -> list[StoredError]:
        """Stored errors in (subscription, seq) order; all subscriptions if None."""
        ...

    def skip_error(self, subscription: str, seq: int) -> int:
        """Mark error ``seq`` skipped and, if the level is ``seq - 1``, move it to ``seq``.

        Returns the level afterwards.  Raises :class:`ApplyError` if there is no
        such error, or the level is below ``seq - 1``.
        """
        ...

    def mark_error(self, subscription: str, seq: int, status: str) -> None:
        """Set a stored error's status (``applied`` after a successful retry)."""
        ...

    def close(self) -> None: ...


def column_of(
    table: pa.Table, index: int, names: Collection[str] | None = None
) -> tuple[pa.ChunkedArray, bool]:
    """The ``index``-th schema column of an apply table, and whether it is variant
    (``names``: the table's column names, when the caller reads several columns)."""
    if names is None:
        names = table.column_names
    if f"c{index}" in names:
        return table.column(f"c{index}"), False
    return table.column(f"v{index}"), True


def _time_from_us(us: int) -> dt.time:
    secs, micro = divmod(us, 1_000_000)
    mins, sec = divmod(secs, 60)
    hour, minute = divmod(mins, 60)
    return dt.time(hour, minute, sec, micro)


_EPOCH = dt.datetime(1970, 1, 1)


def python_values(col: pa.ChunkedArray, column: pb.Column, variant: bool) -> list[object]:
    """Decode an apply column into the Python representation of ``common.values``."""
    raw = col.to_pylist()
    if variant:
        return [None if b is None else values.decode(pb.Value.FromString(b)) for b in raw]
    t = column.type
    if t == T.COLUMN_TYPE_DECIMAL:
        return [None if s is None else decimal.Decimal(s) for s in raw]
    if t == T.COLUMN_TYPE_TIME:
        return [None if us is None else _time_from_us(us) for us in raw]
    if t == T.COLUMN_TYPE_TIMESTAMP:
        return [None if us is None else _EPOCH + dt.timedelta(microseconds=us) for us in raw]
    if t == T.COLUMN_TYPE_TIMESTAMPTZ:
        return [None if s is None else dt.datetime.fromisoformat(s) for s in raw]
    out: list[object] = raw
    return out


def check_level(
    subscription: str, incarnation: str, first_seq: int, level: int, stored: str
) -> None:
    """Refuse (GapError) a batch that does not follow the stored level and incarnation."""
    if first_seq != level + 1:
        raise GapError(
            f"batch starts at seq {first_seq} but the target's level is {level}",
            subscription=subscription,
            seq=first_seq,
        )
    if stored and stored != incarnation:
        raise GapError(
            f"incarnation {incarnation!r} differs from the stored {stored!r}",
            subscription=subscription,
            seq=first_seq,
        )
