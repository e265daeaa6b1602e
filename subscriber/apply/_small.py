"""Net effect of a small batch in the driver, without a Spark job.

A Spark job has a fixed cost that does not depend on its size: on the 2-core
reference machine a key-only net-effect job of 30 rows takes 60-170 ms of wall
time (scheduling two stages, the Arrow hand-off, the result's return), against
about 1 ms for the same computation with Arrow's hash group-by in this process.
In sync, batches are small and frequent, and that fixed cost alone would keep the
in-sync lag above a few hundred milliseconds.  So a batch of plain tables whose
row changes number fewer than ``ApplyOptions.spark_min_rows`` computes its net
effect here; every other batch (and every table with transforms or history) goes
through Spark.  ``spark_min_rows = 0`` sends every batch to Spark.

The computation is the Spark job's, exactly: group the events by ``(_s, key)``
and keep ``max(_pos)``.  Arrow groups NULL key cells together, as Spark's
``groupBy`` does; a struct key column (TIMESTAMPTZ) is grouped by its fields; a
float key is normalized as Spark normalizes it (-0.0 is 0.0, every NaN one NaN).
:func:`supported` says whether Arrow can group every key column of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["groupable", "net_effect_positions_local", "supported"]


def _normal(col: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A float column with -0.0 as 0.0 and one NaN bit pattern (Spark's grouping)."""
    if not pa.types.is_floating(col.type):
        return col
    zero = pa.scalar(0.0, col.type)
    col = pc.if_else(pc.equal(col, zero), zero, col)
    return pc.if_else(pc.is_nan(col), pa.scalar(float("nan"), col.type), col)


def _flat(keys: pa.Table) -> pa.Table:
    """``keys`` ready for Arrow's group-by: struct columns replaced by their fields
    (Arrow cannot group structs), float columns normalized."""
    arrays: list[pa.Array | pa.ChunkedArray] = []
    names: list[str] = []
    for name, col in zip(keys.column_names, keys.columns, strict=True):
        if pa.types.is_struct(col.type):
            combined = col.combine_chunks()
            valid = combined.is_valid()
            for i in range(col.type.num_fields):
                arrays.append(_normal(combined.field(i)))
                names.append(f"{name}.{i}")
            arrays.append(valid)  # a NULL struct differs from one whose fields are NULL
            names.append(f"{name}.valid")
        else:
            arrays.append(_normal(col))
            names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def groupable(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return all(groupable(f.type) for f in t)
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )


def supported(segments: Sequence[pa.Table]) -> bool:
    """True when every key column of ``segments`` can be grouped here."""
    return all(bool(groupable(t)) for keys in segments for t in keys.schema.types[1:])


def net_effect_positions_local(
    segments: Sequence[pa.Table],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per segment, the sorted ``_pos`` of the last event of each key, and the
    ``_pos`` of the same key's first event.

    ``segments`` are ``EventBuffer.keys_table`` tables (``_pos``, then the key
    columns); the result is what ``net_effect_positions`` returns from Spark.
    """
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for keys in segments:
        if keys.num_columns == 2 and _plain_integers(keys.column(1)):
            out.append(_by_integer_key(keys.column(0), keys.column(1)))
            continue
        flat = _flat(keys)
        names = flat.column_names[1:]
        if flat.num_rows == 0:
            out.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))
            continue
        got = flat.group_by(names, use_threads=False).aggregate([("_pos", "max"), ("_pos", "min")])
        pos = got.column("_pos_max").to_numpy().astype(np.int64, copy=False)
        first = got.column("_pos_min").to_numpy().astype(np.int64, copy=False)
        order = np.argsort(pos)
        out.append((pos[order], first[order]))
    return out


def _plain_integers(col: pa.ChunkedArray) -> bool:
    return bool(pa.types.is_integer(col.type) and col.null_count == 0)


def _by_integer_key(
    positions: pa.ChunkedArray, keys: pa.ChunkedArray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`net_effect_positions_local` of one segment keyed by one integer column
    without NULLs (W1's, the usual key), in numpy: sorted by key then position, the
    last and first position of each run of one key.  Arrow's group-by costs ~0.7 ms
    a segment of a few rows (its plan's set-up), this a few microseconds."""
    pos = positions.to_numpy().astype(np.int64, copy=False)
    key = keys.to_numpy()
    if pos.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((pos, key))
    key, pos = key[order], pos[order]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    ends = np.concatenate((starts[1:], [key.size])) - 1
    last, first = pos[ends], pos[starts]
    by_last = np.argsort(last)
    return last[by_last], first[by_last]
