"""What a resolver sees and returns, and the built-in resolvers.

A :class:`Conflict` holds the publisher's row (``None``: the publisher deleted the
row) and the target's (``None``: absent), both as ``{column: value}`` in the Python
forms of ``common.values`` (the target's as its driver reads it back).  A resolver
returns a :class:`Resolution`: a decision (``subscriber.conflictspec.DECISIONS``) and,
for ``apply`` and ``republish``, the row to write (``None``: delete the key).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from subscriber.conflictspec import DECISIONS, ResolverSpec

__all__ = ["KINDS", "Conflict", "Resolution", "builtin_resolution", "jsonable", "python_resolution"]

# insert_exists: the publisher inserted a key the target has; update_missing /
# delete_missing: it changed or deleted a row the target lacks; update_changed /
# delete_changed: the target's row changed since it was last replicated;
# unique_collision: the publisher's row has the unique key of another target row.
KINDS = (
    "insert_exists",
    "update_missing",
    "update_changed",
    "delete_missing",
    "delete_changed",
    "unique_collision",
)

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Conflict:
    subscription: str
    table: str
    kind: str
    key: Row
    publisher_row: Row | None  # None: the publisher deleted the key
    local_row: Row | None  # None: the target has no such row
    seq: int  # the publisher's entry
    commit_time_us: int  # its source commit time (UTC)


@dataclass(frozen=True)
class Resolution:
    decision: str
    row: Row | None = None  # for apply / republish: the row to write (None: delete)

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"resolver decision {self.decision!r}: use one of {DECISIONS}")


def _time_us(v: Any) -> int | None:
    """A row's change time in microseconds since the epoch (UTC), or None if unknown.

    A datetime (naive: UTC), ISO text, or a number of seconds since the epoch."""
    if isinstance(v, str):
        try:
            v = dt.datetime.fromisoformat(v)
        except ValueError:
            return None
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        return int((v - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) / dt.timedelta(microseconds=1))
    if isinstance(v, int | float | decimal.Decimal) and not isinstance(v, bool):
        return int(decimal.Decimal(v) * 1_000_000)
    return None


def builtin_resolution(spec: ResolverSpec, conflict: Conflict, time_column: str) -> Resolution:
    """The decision of a built-in resolver."""
    if spec.kind == "publisher_wins":
        return Resolution("take_publisher")
    if spec.kind == "subscriber_wins":
        return Resolution("ignore")
    # latest_commit_wins: a target row without a time (or no row) loses.
    local = conflict.local_row
    local_us = _time_us(local.get(time_column)) if local is not None else None
    if local_us is None or conflict.commit_time_us >= local_us:
        return Resolution("take_publisher")
    return Resolution("ignore")


def python_resolution(spec: ResolverSpec, conflict: Conflict) -> Resolution:
    """Call a ``python:`` resolver: it returns a decision name, or (decision, row)."""
    assert spec.func is not None
    got = spec.func(conflict)
    if isinstance(got, Resolution):
        return got
    if isinstance(got, str):
        row = conflict.publisher_row if got in ("apply", "republish") else None
        return Resolution(got, row)
    if isinstance(got, tuple) and len(got) == 2:
        return Resolution(str(got[0]), got[1])
    raise ValueError(
        f"resolver {spec.text!r} returned {got!r}: return a decision name or (decision, row)"
    )


def jsonable(v: Any) -> Any:
    """A value as the conflict log's JSON holds it (bytes as hex, decimals and times as text)."""
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    if isinstance(v, decimal.Decimal | dt.date | dt.time | dt.timedelta):
        return str(v)
    if isinstance(v, float) and v != v:
        return "NaN"
    if isinstance(v, dict | list):
        return json.loads(json.dumps(v, default=jsonable))
    return v


def row_json(row: Row | None) -> str | None:
    if row is None:
        return None
    return json.dumps({k: jsonable(v) for k, v in row.items()}, sort_keys=True, default=jsonable)
