"""Seeded small batches for the apply's plan: every column type, in keys too.

:func:`small_batch` draws, from a ``random.Random``, what an in-sync batch looks like
(1-20 entries of a few row changes) over :func:`schemas`: tables with one column of
every type (``tests.support.entries.TYPED_COLUMNS``), each keyed by other columns,
so that every type is a key somewhere (floats and TIMESTAMPTZ together).  Key
cells come from small pools, so keys repeat within a batch (the last event must
win, and the first decide ``fresh``): NULL as an empty ``Value`` and as
``null=True``, -0.0 and 0.0, NaNs of two bit patterns, one instant at two offsets,
an int and the equal decimal text in a DECIMAL column, JSON sent as text.  Now and
then a cell of another kind (a variant column), a key change, a delete, a
TRUNCATE, an SQL statement or a repeated schema op (segment barriers).
"""

from __future__ import annotations

import random
import struct

from common.rpc import txrepl_pb2 as pb
from tests.support.entries import TYPED_COLUMNS, typed_schema

__all__ = ["KEYS", "schemas", "small_batch"]

T = pb.ColumnType

# The primary key of table t_<n>.
KEYS = (("k",), ("f", "tz"), ("i", "bo", "da"), ("d", "j"), ("b", "ti", "ts"))

_NEG_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000001))[0]


def schemas() -> dict[str, pb.TableSchema]:
    """``t_<n>`` for each key of :data:`KEYS`: every column of ``TYPED_COLUMNS``."""
    out = {}
    for n, key in enumerate(KEYS):
        schema = typed_schema(f"t_{n}")
        del schema.primary_key[:]
        schema.primary_key.extend(key)
        for c in schema.columns:
            c.nullable = c.name not in key
        out[schema.table] = schema
    return out


def _pool(ctype: int) -> list[pb.Value]:
    """A few values of ``ctype``, equal ones in several forms."""
    tz = pb.TimestampTz
    pools: dict[int, list[pb.Value]] = {
        T.COLUMN_TYPE_TEXT: [pb.Value(text=t) for t in ("", "a", "é", "a ")],
        T.COLUMN_TYPE_INTEGER: [pb.Value(int=n) for n in (0, -1, 7, 2**62)],
        T.COLUMN_TYPE_DECIMAL: [pb.Value(decimal="5"), pb.Value(int=5), pb.Value(decimal="1.50")],
        T.COLUMN_TYPE_FLOAT: [
            pb.Value(float=x) for x in (0.0, -0.0, 1.5, float("nan"), _NEG_NAN, float("-inf"))
        ],
        T.COLUMN_TYPE_BYTES: [pb.Value(blob=b) for b in (b"", b"\x00", b"ab")],
        T.COLUMN_TYPE_BOOLEAN: [pb.Value(boolean=b) for b in (True, False)],
        T.COLUMN_TYPE_DATE: [pb.Value(date=d) for d in (0, -719_162, 19_000)],
        T.COLUMN_TYPE_TIME: [pb.Value(time_us=t) for t in (0, 86_399_999_999)],
        T.COLUMN_TYPE_TIMESTAMP: [pb.Value(timestamp_us=t) for t in (0, 1_790_000_000_123_456)],
        T.COLUMN_TYPE_TIMESTAMPTZ: [
            pb.Value(timestamptz=tz(utc_us=u, offset_s=o))
            for u, o in ((1_790_000_000_000_000, 0), (1_790_000_000_000_000, 3600), (1, -19_800))
        ],
        T.COLUMN_TYPE_JSON: [
            pb.Value(json='{"a":1}'),
            pb.Value(text='{"a":1}'),
            pb.Value(json="[]"),
        ],
    }
    return pools[ctype]


_TYPES = dict(TYPED_COLUMNS)


def _cell(rng: random.Random, ctype: int, key: bool) -> pb.Value:
    r = rng.random()
    if r < 0.08:
        return pb.Value()
    if r < 0.12:
        return pb.Value(null=True)
    if r < 0.15 and not key:  # a value of another kind: the column becomes a variant one
        return pb.Value(text="other") if ctype != T.COLUMN_TYPE_TEXT else pb.Value(int=3)
    if r < 0.17:  # in keys too, rarely: the key column is then a variant one
        return pb.Value(float=2.5) if ctype != T.COLUMN_TYPE_FLOAT else pb.Value(int=2)
    if not key and rng.random() < 0.5:  # a fresh value, not from the pool
        return _fresh(rng, ctype)
    return rng.choice(_pool(ctype))


def _fresh(rng: random.Random, ctype: int) -> pb.Value:
    n = rng.randint(-(10**9), 10**9)
    if ctype in (T.COLUMN_TYPE_TEXT, T.COLUMN_TYPE_JSON):
        return pb.Value(text=f"v{n}")
    if ctype == T.COLUMN_TYPE_FLOAT:
        return pb.Value(float=n / 7)
    if ctype == T.COLUMN_TYPE_TIMESTAMPTZ:
        return pb.Value(
            timestamptz=pb.TimestampTz(utc_us=n * 10**6 + 17, offset_s=rng.choice([0, 5400]))
        )
    if ctype == T.COLUMN_TYPE_DATE:
        return pb.Value(date=n % 100_000)
    return rng.choice(_pool(ctype))


def _row(rng: random.Random, schema: pb.TableSchema) -> list[pb.Value]:
    keys = set(schema.primary_key)
    return [_cell(rng, c.type, c.name in keys) for c in schema.columns]


def _key(schema: pb.TableSchema, row: list[pb.Value]) -> list[pb.Value]:
    names = [c.name for c in schema.columns]
    return [row[names.index(k)] for k in schema.primary_key]


def _op(rng: random.Random, tables: dict[str, pb.TableSchema]) -> pb.Op:
    schema = tables[rng.choice(sorted(tables))]
    table = schema.table
    r = rng.random()
    if r < 0.02:
        return pb.Op(row=pb.RowChange(table=table, op=pb.ROW_OP_TRUNCATE))
    if r < 0.04:
        return pb.Op(sql=pb.SqlStatement(sql="SELECT 1"))
    if r < 0.06:
        return pb.Op(schema=schema)
    row = _row(rng, schema)
    if r < 0.45:
        return pb.Op(row=pb.RowChange(table=table, op=pb.ROW_OP_INSERT, row=row))
    if r < 0.8:  # an update: the same key, given or not, or a key change
        how = rng.random()
        key = _key(schema, row) if how < 0.5 else _key(schema, _row(rng, schema))
        if how < 0.25:
            key = []
        return pb.Op(row=pb.RowChange(table=table, op=pb.ROW_OP_UPDATE, key=key, row=row))
    return pb.Op(row=pb.RowChange(table=table, op=pb.ROW_OP_DELETE, key=_key(schema, row)))


def small_batch(rng: random.Random, tables: dict[str, pb.TableSchema]) -> list[pb.Entry]:
    """1-20 entries of 1-6 ops on ``tables``, commit times increasing."""
    at = 1_790_000_000_000_000 + rng.randint(0, 10**6)
    entries = []
    for i in range(rng.choice([1, 1, 2, 3, 5, 20])):
        ops = [_op(rng, tables) for _ in range(rng.randint(1, 6))]
        entries.append(pb.Entry(commit_time_us=at + i * 1000, ops=ops))
    return entries
