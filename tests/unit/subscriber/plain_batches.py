"""Seeded in-sync batches of every column type at its extremes, for the plain rows
steps (subscriber/apply/_plain.py) checked against the Arrow ones.

Tables ``t_<n>`` (``tests.support.plan_batches.KEYS``: every type is a key somewhere)
with every column of ``TYPED_COLUMNS``.  Key cells come from small pools (never
NULL: the targets refuse a NULL key), so keys repeat: same-key chains (insert,
update, delete, insert again), key changes, deletes of present and absent keys.
Other cells are NULL (both forms), a pool value or an extreme: integers at +-2**63,
floats -0.0 / +-inf / NaNs of two bit patterns / subnormals, decimals of every
scale, dates and timestamps of years 1 and 9999, TIMESTAMPTZ at +-14:00, text
beyond the BMP, bytes with NULs, JSON as JSON and as text.  ``variants``: now and
then a cell of another kind (the step then goes the Arrow way).
"""

from __future__ import annotations

import random
import struct

from common.rpc import txrepl_pb2 as pb
from tests.support.plan_batches import KEYS, schemas

__all__ = ["KEYS", "batch", "schemas"]

T = pb.ColumnType
V = pb.Value
_NEG_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000001))[0]
_TZ = pb.TimestampTz
_DAY_US = 86_400 * 10**6
_Y1_US = -62_135_596_800 * 10**6  # 0001-01-01T00:00 UTC
_Y9999_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999 UTC

_KEY_POOL: dict[int, list[pb.Value]] = {
    T.COLUMN_TYPE_TEXT: [V(text=t) for t in ("a", "é", "b'c", "日本😀")],
    T.COLUMN_TYPE_INTEGER: [V(int=n) for n in (-(2**63), 2**63 - 1, 0, 7)],
    T.COLUMN_TYPE_DECIMAL: [V(decimal="5"), V(int=5), V(decimal="-0.000001")],
    T.COLUMN_TYPE_FLOAT: [V(float=x) for x in (0.0, -0.0, float("nan"), _NEG_NAN, 1e300)],
    T.COLUMN_TYPE_BYTES: [V(blob=b) for b in (b"", b"\x00", b"\xff\x00a")],
    T.COLUMN_TYPE_BOOLEAN: [V(boolean=b) for b in (True, False)],
    T.COLUMN_TYPE_DATE: [V(date=d) for d in (0, -719_162, 2_932_896)],
    T.COLUMN_TYPE_TIME: [V(time_us=t) for t in (0, 86_399_999_999)],
    T.COLUMN_TYPE_TIMESTAMP: [V(timestamp_us=t) for t in (_Y1_US, 0, _Y9999_US)],
    T.COLUMN_TYPE_TIMESTAMPTZ: [
        V(timestamptz=_TZ(utc_us=u, offset_s=o))
        # distinct instants: one instant at two offsets is two keys here, one to
        # PostgreSQL (its ON CONFLICT refuses a command touching a row twice)
        for u, o in ((1_790_000_000_000_000, 0), (1_790_000_000_000_001, 3600), (1, -19_800))
    ],
    T.COLUMN_TYPE_JSON: [V(json='{"a": 1}'), V(text="[]")],
}

_EXTREMES: dict[int, list[pb.Value]] = {
    T.COLUMN_TYPE_TEXT: [V(text=t) for t in ("", "a\tb\nc", "\\ %s $1", "\U0010ffff")],
    T.COLUMN_TYPE_INTEGER: [V(int=n) for n in (-(2**63), 2**63 - 1, -1)],
    T.COLUMN_TYPE_DECIMAL: [
        V(decimal=d)
        for d in ("0", "1.50", "-99999999999999.99", "0.000000000000000001", "1" * 30, "-7")
    ],
    T.COLUMN_TYPE_FLOAT: [
        V(float=x)
        for x in (-0.0, float("inf"), float("-inf"), float("nan"), _NEG_NAN, 5e-324, 0.1, 1e16)
    ]
    + [V(float=1.7976931348623157e308), V(float=2.5e-5), V(float=-1156227450256.9316)],
    T.COLUMN_TYPE_BYTES: [V(blob=bytes(range(256))), V(blob=b"")],
    T.COLUMN_TYPE_BOOLEAN: [V(boolean=True), V(boolean=False)],
    T.COLUMN_TYPE_DATE: [V(date=d) for d in (-719_162, 2_932_896, -1, 10_957)],
    T.COLUMN_TYPE_TIME: [V(time_us=t) for t in (0, 1, 86_399_999_999, 43_200_000_000)],
    T.COLUMN_TYPE_TIMESTAMP: [V(timestamp_us=t) for t in (_Y1_US, _Y9999_US, -1, 10**15)],
    T.COLUMN_TYPE_TIMESTAMPTZ: [
        V(timestamptz=_TZ(utc_us=u, offset_s=o))
        for u, o in (
            (_Y1_US + _DAY_US, 50_400),
            (_Y9999_US - _DAY_US, -50_400),
            (0, 0),
            (1_790_000_000_123_456, 19_800),
        )
    ],
    T.COLUMN_TYPE_JSON: [V(json='{"a": [1, "x\'y"]}'), V(text="null"), V(json='"\\\\ %s"')],
}


def _cell(rng: random.Random, ctype: int, variants: bool) -> pb.Value:
    r = rng.random()
    if r < 0.1:
        return V() if r < 0.05 else V(null=True)
    if variants and r < 0.12:  # a value of another kind: a variant column
        return V(text="other") if ctype != T.COLUMN_TYPE_TEXT else V(int=3)
    if r < 0.4:
        return rng.choice(_KEY_POOL[ctype])
    if r < 0.5 and ctype == T.COLUMN_TYPE_FLOAT:
        return V(float=rng.uniform(-1e6, 1e6) * 10.0 ** rng.randint(-30, 30))
    return rng.choice(_EXTREMES[ctype])


def _row(rng: random.Random, schema: pb.TableSchema, variants: bool) -> list[pb.Value]:
    keys = set(schema.primary_key)
    return [
        rng.choice(_KEY_POOL[c.type]) if c.name in keys else _cell(rng, c.type, variants)
        for c in schema.columns
    ]


def _key(schema: pb.TableSchema, row: list[pb.Value]) -> list[pb.Value]:
    names = [c.name for c in schema.columns]
    return [row[names.index(k)] for k in schema.primary_key]


def _op(rng: random.Random, schema: pb.TableSchema, variants: bool) -> pb.Op:
    table = schema.table
    row = _row(rng, schema, variants)
    r = rng.random()
    if r < 0.4:
        return pb.Op(row=pb.RowChange(table=table, op=pb.ROW_OP_INSERT, row=row))
    if r < 0.75:  # an update of the same key (given or not), or a key change
        how = rng.random()
        key = _key(schema, row) if how < 0.6 else _key(schema, _row(rng, schema, variants))
        if how < 0.3:
            key = []
        return pb.Op(row=pb.RowChange(table=table, op=pb.ROW_OP_UPDATE, key=key, row=row))
    return pb.Op(row=pb.RowChange(table=table, op=pb.ROW_OP_DELETE, key=_key(schema, row)))


def batch(
    rng: random.Random, tables: dict[str, pb.TableSchema], variants: bool = False
) -> list[pb.Entry]:
    """1-10 entries of 1-4 row changes on one or two of ``tables``."""
    names = rng.sample(sorted(tables), rng.choice([1, 1, 2]))
    at = 1_790_000_000_000_000 + rng.randint(0, 10**6)
    return [
        pb.Entry(
            commit_time_us=at + i * 1000,
            ops=[_op(rng, tables[rng.choice(names)], variants) for _ in range(rng.randint(1, 4))],
        )
        for i in range(rng.choice([1, 1, 1, 2, 3, 10]))
    ]
