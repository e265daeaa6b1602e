"""The plan of a small batch in plain Python: a cost that follows the batch's size.

In sync a batch is one entry or a few (those that came while the apply before ran),
and its plan ran the vectorized path built for catch-up: the numpy walk (about
0.3 ms however small the batch), numpy decoding (50-400 us a column), numpy
searches and Arrow takes per table -- 2.5 ms for one W1 entry, of an in-sync lag
budget of 10 ms (issue 23).  Each piece below computes the vectorized path's result
another way, whose cost is per op, per cell, per event:

1. **Walk.**  A batch of at most :data:`FEW_BYTES` serialized bytes and
   :data:`FEW_OPS` ops is walked op by op (``Planning._plan_python``, the reference
   the numpy walk is tested against) over its shadow entries (``_wire.py``), parsed
   once here.  The size is read before anything is parsed: a big batch pays no more
   than a sum of lengths.
2. **Decoding.**  A table's events numbering at most ``_events.FEW_EVENTS`` are
   decoded cell by cell (``_events.py``: the per-cell path is the reference).
3. **Net effect** (:func:`few_rows_step`, a plain table's events of a segment, at
   most ``FEW_EVENTS``).  One pass in event order (which is ``_pos`` order) fills a
   dict from key to ``[last, first]`` event index.  The key of an event is its
   decoded key cells (``to_pylist`` of the key columns: the values Spark's groupBy
   compares, one value for one key column, a tuple for more), with every NaN
   replaced by one sentinel: Spark groups all NaNs together, and Python's NaN
   equals no NaN.  -0.0 and 0.0 are one key already (equal, same hash), as Spark's
   normalization makes them; NULLs (None) are one key, as in Spark's groupBy.  A key
   column of an Arrow type that Arrow could not group either (``_small.groupable``)
   declines: the table takes the vectorized path.
4. **Steps.**  The survivors (each key's last event, in ``_pos`` order) are taken
   from the event table by index: the deletes; then the upserts whose key's first
   event is a source INSERT (``RowsStep.fresh``), then the others, each part in
   ``_pos`` order; ``_born`` (the key's first event is an INSERT) and, with
   ``commit_times``, ``_commit_us`` (the source commit time of the survivor's entry)
   appended as the vectorized path appends them.

5. **Plain values** (``_plain.py``).  When every cell is of its column's kind, the
   cells are decoded once into Python values (:func:`~subscriber.apply._plain.decoded`),
   the keys grouped from them, and the step is a :class:`~subscriber.apply._plain.FewRows`:
   the writers read the survivors' values; the Arrow tables above are built only when
   something reads them.  A variant column keeps the Arrow way throughout.

``tests/unit/subscriber/test_apply_few.py`` plans seeded batches both ways and
compares the steps exactly; ``test_apply_plain.py`` compares the plain values with
the Arrow tables and what each target is handed from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._events import EventBuffer
from subscriber.apply._plain import FewRows, decoded
from subscriber.apply._small import groupable
from subscriber.apply._wire import shadow
from subscriber.apply.entry import AnyEntry
from subscriber.apply.writer import RowsStep

__all__ = ["FEW_BYTES", "FEW_OPS", "few_entries", "few_rows_step"]

# A batch of at most this many ops and serialized bytes is walked op by op.
FEW_OPS = 256
FEW_BYTES = 64 * 1024

_INSERT = int(pb.ROW_OP_INSERT)
_FLOAT = int(pb.ColumnType.COLUMN_TYPE_FLOAT)


class _NaN:
    """The one key every NaN of a float key column is (see the module doc)."""


_NAN = _NaN()


def few_entries(entries: Sequence[AnyEntry]) -> list[Any] | None:
    """The batch's shadow entries when it is small enough to walk op by op, else None.

    Parsed entries are measured without a parse (their ops counted, their size
    computed); serialized ones by their length, then parsed one by one until the
    ops counted pass :data:`FEW_OPS`: a larger batch pays at most that much parsing.
    """
    if len(entries) > FEW_OPS:
        return None
    size = ops = 0
    for entry in entries:
        if isinstance(entry, pb.Entry):
            ops += len(entry.ops)
            size += entry.ByteSize()
        else:
            size += len(entry.SerializeToString())
        if size > FEW_BYTES or ops > FEW_OPS:
            return None
    shadows = []
    ops = 0
    for entry in entries:
        shadows.append(shadow(entry))
        ops += len(shadows[-1].ops)
        if ops > FEW_OPS:
            return None
    return shadows


def _keys(columns: list[pa.Array]) -> list[Any] | None:
    """Per event, the value its key is grouped by; None: a type not grouped here."""
    cells: list[list[Any]] = []
    for col in columns:
        if not groupable(col.type) or pa.types.is_struct(col.type):
            return None
        values = col.to_pylist()
        if pa.types.is_floating(col.type):
            values = [_NAN if v != v else v for v in values]
        cells.append(values)
    return cells[0] if len(cells) == 1 else list(zip(*cells, strict=True))


def _plain_keys(columns: list[list[Any]], floats: list[bool]) -> list[Any]:
    """:func:`_keys` of decoded values (``_plain.decoded``, every type grouped)."""
    cells = [
        [_NAN if v != v else v for v in values] if f else values
        for values, f in zip(columns, floats, strict=True)
    ]
    return cells[0] if len(cells) == 1 else list(zip(*cells, strict=True))


def _winners(keys: list[Any]) -> list[list[int]]:
    """``[last, first]`` event index of each key, in order of the last."""
    seen: dict[Any, list[int]] = {}
    for j, key in enumerate(keys):
        got = seen.get(key)
        if got is None:
            seen[key] = [j, j]
        else:
            got[0] = j
    return sorted(seen.values())


def few_rows_step(
    buf: EventBuffer,
    schema: pb.TableSchema,
    first_seq: int,
    commit_times: Callable[[], pa.Array] | None,
) -> RowsStep | None:
    """The rows step of a plain table's few events (``schema``: its target's), or None
    when its key columns are not grouped here (see the module doc)."""
    if not buf.few:
        return None
    values = decoded(buf)
    if values is None:  # a variant column: grouped and built in Arrow
        keys = _keys([buf.column(i)[1] for i in buf.key_index])
        if keys is None:
            return None
    else:
        floats = [buf.schema.columns[i].type == _FLOAT for i in buf.key_index]
        keys = _plain_keys([values[i] for i in buf.key_index], floats)
    winners = _winners(keys)
    dels, ops, seqs = buf.deletes, buf.ops, buf.seqs
    gone: list[list[int]] = []
    fresh: list[list[int]] = []
    rest: list[list[int]] = []
    for w in winners:
        if dels[w[0]]:
            gone.append(w)
        elif ops[w[1]] == _INSERT:
            fresh.append(w)
        else:
            rest.append(w)
    times = commit_times().to_pylist() if commit_times is not None else None

    def survivors(events: pa.Table, rows: list[list[int]]) -> pa.Table:
        at = [last for last, _ in rows]
        if not at:
            out = events.slice(0, 0)
        elif at == list(range(events.num_rows)):  # every event, in order
            out = events
        else:
            out = events.take(pa.array(at, pa.int64()))
        out = out.append_column("_born", pa.array([ops[f] == _INSERT for _, f in rows], pa.bool_()))
        if times is not None:
            us = [times[seqs[last] - first_seq] for last, _ in rows]
            out = out.append_column("_commit_us", pa.array(us, pa.int64()))
        return out

    def arrow() -> tuple[pa.Table, pa.Table]:
        events = buf.to_arrow()
        return survivors(events, gone), survivors(events, fresh + rest)

    if values is None:
        return RowsStep(schema, *arrow(), fresh=len(fresh))
    return FewRows(
        schema, values, [w[0] for w in gone], [w[0] for w in fresh + rest], len(fresh), arrow
    )
