"""Decoding a column of large values takes memory in its number of cells, not in
its bytes (issue 21: a subscriber applying a backlog of 100 KB documents)."""

from __future__ import annotations

import os
import tracemalloc

import pyarrow as pa

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._wire import decode_column

T = pb.ColumnType
CELLS = 80
VALUE_BYTES = 100_000  # 8 MB of text in all


def test_a_column_of_large_text_values_is_decoded_without_copies_per_byte() -> None:
    texts = [os.urandom(VALUE_BYTES // 2).hex() for _ in range(CELLS)]
    cells = pa.array([pb.Value(text=t).SerializeToString() for t in texts], pa.binary())
    column_bytes = cells.buffers()[2].size

    tracemalloc.start()
    try:
        got = decode_column(T.COLUMN_TYPE_TEXT, cells)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert got is not None
    arr, valid = got
    assert valid.all()
    assert arr.to_pylist() == texts
    # numpy's temporaries (traced): a few per cell.  The position of every byte
    # without a continuation bit, searched before, was 8 bytes per byte of text
    # (plus a padded copy of the column): about 9 times the column.
    assert peak < column_bytes // 4, (peak, column_bytes)
