"""SQLite capture's wire bytes (publisher/capture/sqlite/wire.py) equal what the
protobuf objects of exact.py serialize to, for every column type and every storage
class SQLite can hand over, extremes included: a differential over a seeded
generator, the objects as the oracle."""

from __future__ import annotations

import random

import pytest

from common.rpc import txrepl_pb2 as pb
from publisher.capture.sqlite.exact import encode_stored
from publisher.capture.sqlite.wire import row_op, value_bytes

TYPES = [t for t in pb.ColumnType.values() if t != pb.COLUMN_TYPE_UNSPECIFIED] + [
    pb.COLUMN_TYPE_UNSPECIFIED
]

EDGES: list[object] = [
    None, 0, 1, -1, 127, 128, -128, 2**31, -(2**31), 2**53, 2**53 + 1, -(2**53) - 1,
    2**63 - 1, -(2**63), True, False, 0.0, -0.0, 1.5, -2.25, 1e300, -1e-300,
    float("inf"), float("-inf"), 5e-324, "", "a", "é", "x" * 200, "\x00nul",
    "bad \udcff utf-8", "2024-02-29", "2024-02-29T12:34:56", "2024-02-29T12:34:56+02:00",
    "12:34:56", "12.30", "1e5", "true", "[1, 2]", '{"a": 1}', b"", b"\x00\xff", b"x" * 300,
]  # fmt: skip


def _random_value(rng: random.Random) -> object:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randrange(-(2**63), 2**63)
    if kind == 1:
        return rng.choice([rng.uniform(-1e6, 1e6), round(rng.uniform(-1e4, 1e4), 2)])
    if kind == 2:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(160, 0x2FFF)]))
                       for _ in range(rng.randrange(0, 150)))  # fmt: skip
    if kind == 3:
        return rng.randbytes(rng.randrange(0, 200))
    if kind == 4:
        return rng.choice(EDGES)
    return None


@pytest.mark.parametrize("ctype", TYPES, ids=lambda t: pb.ColumnType.Name(t))
def test_value_bytes_equal_the_serialized_value(ctype: int) -> None:
    rng = random.Random(ctype)
    for value in EDGES + [_random_value(rng) for _ in range(2000)]:
        for scale in (0, 2):
            want = encode_stored(value, ctype, scale).SerializeToString()
            assert value_bytes(value, ctype, scale) == want, (value, scale)


def test_a_row_op_equals_the_op_built_from_objects() -> None:
    rng = random.Random(7)
    for _ in range(500):
        width = rng.randrange(1, 12)
        types = [(rng.choice(TYPES), rng.choice((0, 2))) for _ in range(width)]
        row = [_random_value(rng) for _ in range(width)]
        key = row[: rng.randrange(0, width + 1)]
        table = rng.choice(["t", "Öl tabelle", "s.t", "x" * 300])
        op = rng.choice([pb.ROW_OP_INSERT, pb.ROW_OP_UPDATE, pb.ROW_OP_DELETE])
        has_key, has_row = rng.random() < 0.7, rng.random() < 0.9
        want = pb.Op()
        want.row.table = table
        want.row.op = op
        if has_key:
            want.row.key.extend(encode_stored(v, *ts) for v, ts in zip(key, types, strict=False))
        if has_row:
            want.row.row.extend(encode_stored(v, *ts) for v, ts in zip(row, types, strict=False))
        got = row_op(
            table.encode(),
            int(op),
            zip(key, types, strict=False) if has_key else None,
            zip(row, types, strict=False) if has_row else None,
        )
        assert got == want
        assert got.SerializeToString() == want.SerializeToString()
