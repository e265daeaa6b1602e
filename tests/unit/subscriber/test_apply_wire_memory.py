"""Decoding a column of large values takes memory in its number of cells, not in
its bytes (issue 21: a subscriber applying a backlog of 100 KB documents)."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pyarrow as pa

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._wire import decode_column

T = pb.ColumnType
ROOT = Path(__file__).resolve().parents[3]
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


_LIST_DECODE = f"""
import os
import pyarrow as pa
from common.rpc import txrepl_pb2 as pb
from subscriber.apply._wire import decode_column
texts = [os.urandom({VALUE_BYTES // 2}).hex() for _ in range({CELLS})]
cells = [pb.Value(text=t).SerializeToString() for t in texts]
got = decode_column(pb.ColumnType.COLUMN_TYPE_TEXT, cells)
assert got is not None and got[0].to_pylist() == texts
print(pa.default_memory_pool().max_memory())
"""


def test_a_list_of_large_cells_becomes_one_array_without_a_growing_builder() -> None:
    # A fresh interpreter: Arrow's pool keeps its peak for the process's lifetime.
    out = subprocess.run(
        [sys.executable, "-c", _LIST_DECODE], capture_output=True, text=True, check=True, cwd=ROOT
    )
    arrow_peak = int(out.stdout.split()[-1])
    # The decoded column (8 MB) is Arrow's; a builder fed cell by cell doubled its
    # buffer up to twice the column and held both while it grew.
    assert arrow_peak < 1.5 * CELLS * VALUE_BYTES, arrow_peak
