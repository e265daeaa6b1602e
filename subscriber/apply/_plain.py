"""A few events' rows step as plain Python values: no Arrow between the wire and the writer.

In sync a rows step holds a handful of rows, and building it in Arrow (the events'
table, a ``take`` of the survivors, two appended columns) then reading it back
(PostgreSQL's cast to text, SQLite's ``to_pylist``) was about a quarter of the apply
thread's CPU per one-entry batch (docs/performance.md).  :class:`FewRows` is the
:class:`~subscriber.apply.writer.RowsStep` of ``_few.py`` that keeps the survivors'
decoded cells instead:

* **The values.**  :func:`decoded` converts every cell of every event with the
  per-cell converters of ``_events.py`` (``_TYPED``), the ones the Arrow column of a
  few events is built from (``_events._column``), so a cell's value here is the value
  handed to ``pa.array``.  :meth:`FewRows.columns` gives them in the form the Arrow
  column's ``to_pylist`` gives (a DATE as ``datetime.date``: the one conversion).
  A cell not of its column's kind makes ``_column`` a *variant* column (its cells
  kept serialized, named ``v{i}``); then :func:`decoded` returns None and the step is
  built in Arrow as before, so the plain path never meets a variant column.
* **Exactness by construction.**  A writer that reads :meth:`FewRows.columns`
  instead of the Arrow tables must produce from them what it produces from
  ``column.to_pylist()``; where it formats through Arrow (PostgreSQL's floats and
  times), it builds the column with :func:`arrow_column` (``pa.array`` of the same
  values and type as ``_column``: the same array).
* **Everything else is unchanged.**  :attr:`FewRows.deletes` and
  :attr:`FewRows.upserts` are the Arrow tables ``_few.py`` built before, built on the
  first read (conflict guards, the constraint-safe order, JDBC staging read them):
  a reader of the Arrow tables sees the very same tables.  Counts are
  :meth:`RowsStep.counts`, which builds nothing.

``tests/unit/subscriber/test_apply_plain.py`` runs seeded batches of every type
through both paths and compares what each target is handed and the rows it ends
with.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import pyarrow as pa

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._events import _FIELD, _TYPED, _WHICH, EventBuffer, _Mismatch
from subscriber.apply.writer import RowsStep

__all__ = ["FewRows", "arrow_column", "decoded"]

_DATE = int(pb.ColumnType.COLUMN_TYPE_DATE)
_EPOCH = dt.date(1970, 1, 1).toordinal()
_MIN_DAYS = dt.date.min.toordinal() - _EPOCH
_MAX_DAYS = dt.date.max.toordinal() - _EPOCH


def decoded(buf: EventBuffer) -> list[list[Any]] | None:
    """Per schema column, every event's value as ``_events._column`` converts it
    (DATE as ``datetime.date``); None when some cell is not of its column's kind or
    a DATE is outside ``datetime.date`` (the Arrow path then decides)."""
    width = buf.width
    cells = list(map(pb.Value.FromString, buf.cells))
    out: list[list[Any]] = []
    for i, column in enumerate(buf.schema.columns):
        got = _TYPED.get(column.type)
        if got is None:
            return None
        column_cells = cells[i::width]
        kinds = list(map(_WHICH, column_cells))
        own = _FIELD.get(column.type)
        if own is not None and set(kinds) <= {own, None, "null"}:
            # every cell of the column's own kind or NULL: what the converter returns
            get = attrgetter(own)
            values: list[Any] = [
                get(c) if k == own else None for c, k in zip(column_cells, kinds, strict=True)
            ]
        else:
            conv = got[0]
            try:
                values = [conv(c) for c in column_cells]
            except _Mismatch:
                return None
        if column.type == _DATE:
            if any(v is not None and not _MIN_DAYS <= v <= _MAX_DAYS for v in values):
                return None
            values = [None if v is None else dt.date.fromordinal(v + _EPOCH) for v in values]
        out.append(values)
    return out


def arrow_column(column: pb.Column, values: list[Any]) -> pa.Array:
    """The Arrow column ``_events._column`` builds of these (``columns``) values."""
    return pa.array(values, type=pa.date32() if column.type == _DATE else _TYPED[column.type][1])


class FewRows(RowsStep):
    """A :class:`RowsStep` of survivors kept as decoded values (module docstring).

    ``gone`` and ``live`` are the event indexes of the deleted and upserted keys'
    last events, in step order; ``arrow`` builds the Arrow tables from them.
    """

    # Not the dataclass's __init__: deletes and upserts are properties here.
    def __init__(
        self,
        schema: pb.TableSchema,
        values: list[list[Any]],
        gone: list[int],
        live: list[int],
        fresh: int,
        arrow: Callable[[], tuple[pa.Table, pa.Table]],
    ) -> None:
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "fresh", fresh)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_at", (gone, live))
        object.__setattr__(self, "_arrow", arrow)
        object.__setattr__(self, "_built", None)

    def _tables(self) -> tuple[pa.Table, pa.Table]:
        built: tuple[pa.Table, pa.Table] | None = self.__dict__["_built"]
        if built is None:
            built = self.__dict__["_arrow"]()
            object.__setattr__(self, "_built", built)
        return built

    @property
    def deletes(self) -> pa.Table:
        return self._tables()[0]

    @property
    def upserts(self) -> pa.Table:
        return self._tables()[1]

    def counts(self) -> tuple[int, int]:
        gone, live = self.__dict__["_at"]
        return len(gone), len(live)

    def columns(self, upserts: bool, indexes: list[int]) -> list[list[Any]] | None:
        at = self.__dict__["_at"][1 if upserts else 0]
        values = self.__dict__["_values"]
        return [[values[i][j] for j in at] for i in indexes]
