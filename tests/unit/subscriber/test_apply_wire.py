"""Column-wise decoding of serialized values (subscriber/apply/_wire.py) against the
per-cell path it replaces (subscriber/apply/_events.py), value for value."""

from __future__ import annotations

import datetime
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from common import values
from common.rpc import txrepl_pb2 as pb
from subscriber.apply import _events, _wire
from subscriber.apply._wire import SEntry, decode_column, gather, shadow

T = pb.ColumnType


def _value(ctype: int, rng: random.Random) -> pb.Value:
    r = rng.random()
    if r < 0.1:
        return pb.Value()
    if r < 0.15:
        return pb.Value(null=True)
    big = rng.choice([0, 1, -1, 127, 128, -129, 2**31 - 1, -(2**31), 2**62, -(2**63), 2**63 - 1])
    small = rng.randint(-(10**6), 10**6)
    n = rng.choice([big, small])
    text = "".join(rng.choice('aé€\U0001f600\\",x\n') for _ in range(rng.randint(0, 300)))
    if ctype == T.COLUMN_TYPE_INTEGER:
        return pb.Value(int=n)
    if ctype == T.COLUMN_TYPE_DECIMAL:
        return pb.Value(decimal=f"{small}.{rng.randint(0, 99):02d}")
    if ctype == T.COLUMN_TYPE_FLOAT:
        return pb.Value(float=rng.choice([0.0, -0.0, 1.5, -1e300, float(small) / 7]))
    if ctype in (T.COLUMN_TYPE_TEXT, T.COLUMN_TYPE_JSON):
        return pb.Value(text=text) if ctype == T.COLUMN_TYPE_TEXT else pb.Value(json=text)
    if ctype == T.COLUMN_TYPE_BYTES:
        return pb.Value(blob=text.encode())
    if ctype == T.COLUMN_TYPE_BOOLEAN:
        return pb.Value(boolean=rng.random() < 0.5)
    if ctype == T.COLUMN_TYPE_DATE:
        return pb.Value(date=rng.randint(-700_000, 2_900_000))
    if ctype == T.COLUMN_TYPE_TIME:
        return pb.Value(time_us=rng.randint(0, 86_400 * 10**6 - 1))
    if ctype == T.COLUMN_TYPE_TIMESTAMP:
        return pb.Value(timestamp_us=small * 10**9 + rng.choice([0, 123_456]))
    assert ctype == T.COLUMN_TYPE_TIMESTAMPTZ
    return pb.Value(
        timestamptz=pb.TimestampTz(
            utc_us=small * 10**7 + rng.choice([0, 1, 999_999]),
            offset_s=rng.choice([0, 3600, -19_800, 5 * 3600 + 30 * 60 + 15, -43_200]),
        )
    )


TYPES = [
    T.COLUMN_TYPE_INTEGER,
    T.COLUMN_TYPE_DECIMAL,
    T.COLUMN_TYPE_FLOAT,
    T.COLUMN_TYPE_TEXT,
    T.COLUMN_TYPE_JSON,
    T.COLUMN_TYPE_BYTES,
    T.COLUMN_TYPE_BOOLEAN,
    T.COLUMN_TYPE_DATE,
    T.COLUMN_TYPE_TIME,
    T.COLUMN_TYPE_TIMESTAMP,
    T.COLUMN_TYPE_TIMESTAMPTZ,
]


def _reference(ctype: int, cells: list[pb.Value]) -> tuple[str, list[object]]:
    """The per-cell path, as before the column-wise decoder."""
    conv, atype = _events._TYPED[ctype]
    try:
        arr = pa.array([conv(c) for c in cells], type=atype)
        if ctype == T.COLUMN_TYPE_DATE:
            arr = arr.cast(pa.date32())
        return "c", arr.to_pylist()
    except _events._Mismatch:
        return "v", [None if _events._kind(c) is None else c.SerializeToString() for c in cells]


@pytest.mark.parametrize("ctype", TYPES, ids=lambda t: T.Name(t))
@pytest.mark.parametrize("seed", range(4))
def test_column_matches_the_per_cell_path(ctype: pb.ColumnType.ValueType, seed: int) -> None:
    rng = random.Random(seed)
    cells = [_value(ctype, rng) for _ in range(rng.choice([1, 5, 300]))]
    if seed == 3:  # one value of another kind: the whole column is variant
        cells[rng.randrange(len(cells))] = pb.Value(text="x") if ctype != 5 else pb.Value(int=1)
    col = pb.Column(name="c", type=ctype)
    name, arr = _events._wire_column(0, col, [c.SerializeToString() for c in cells])
    kind, expected = _reference(ctype, cells)
    assert name == f"{kind}0"
    assert arr.to_pylist() == expected


def test_decoder_declines_what_it_does_not_decode() -> None:
    ints = [pb.Value(int=1).SerializeToString(), pb.Value(text="1").SerializeToString()]
    assert decode_column(T.COLUMN_TYPE_INTEGER, ints) is None
    assert decode_column(T.COLUMN_TYPE_UNSPECIFIED, ints[:1]) is None
    unknown = pb.Value(int=1).SerializeToString() + b"\x78\x01"  # a field from the future
    assert decode_column(T.COLUMN_TYPE_INTEGER, [unknown]) is None
    nulls = decode_column(T.COLUMN_TYPE_TEXT, [b"", pb.Value(null=True).SerializeToString()])
    assert nulls is not None
    assert nulls[0].to_pylist() == [None, None]


def test_shadow_entry_keeps_the_wire_layout() -> None:
    schema = pb.TableSchema(table="t", columns=[pb.Column(name="a")], primary_key=["a"])
    row = pb.RowChange(
        table="t", op=pb.ROW_OP_UPDATE, key=[pb.Value(int=1)], row=[pb.Value(text="é")]
    )
    entry = pb.Entry(
        commit_time_us=-5,
        source_position="p",
        ops=[pb.Op(row=row), pb.Op(schema=schema), pb.Op(sql=pb.SqlStatement(sql="x"))],
    )
    s = shadow(entry)
    assert isinstance(s, SEntry)
    assert s.commit_time_us == -5
    assert [op.WhichOneof("kind") for op in s.ops] == ["row", "schema", "sql"]
    assert s.ops[0].row.table == "t"
    assert s.ops[0].row.op == pb.ROW_OP_UPDATE
    assert list(s.ops[0].row.key) == [pb.Value(int=1).SerializeToString()]
    assert list(s.ops[0].row.row) == [pb.Value(text="é").SerializeToString()]
    assert pb.TableSchema.FromString(s.ops[1].schema) == schema


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.integers(
                    -30_610_224_000_000_000 + 2 * 86_400 * 10**6,
                    253_402_300_799_999_999 - 2 * 86_400 * 10**6,
                ),
                st.integers(-(10**9), 10**9).map(lambda s: s * 1_000_000),  # whole seconds
            ),
            st.integers(-86_399, 86_399),
        ),
        min_size=1,
        max_size=50,
    )
)
@example([(0, 0), (1, 3600), (-1, -19_800), (253_402_300_799_999_999 - 2 * 86_400 * 10**6, 0)])
def test_timestamptz_text_is_isoformat(values_: list[tuple[int, int]]) -> None:
    """TIMESTAMPTZ columns become exactly ``datetime.isoformat()`` of each value."""
    cells = [pb.Value(timestamptz=pb.TimestampTz(utc_us=u, offset_s=o)) for u, o in values_]
    iso = [_iso(values.decode(c)) for c in cells]
    text = _events.tz_text(np.array([u for u, _ in values_]), np.array([o for _, o in values_]))
    assert text is not None
    assert text.to_pylist() == iso
    sliced = _events.tz_text(
        np.array([u for u, _ in values_] * 2)[1:], np.array([o for _, o in values_] * 2)[1:]
    )
    assert sliced is not None
    assert sliced.to_pylist() == (iso * 2)[1:]


def _iso(value: object) -> str:
    assert isinstance(value, datetime.datetime)
    return value.isoformat()


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=300),
    cuts=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 20), st.booleans()), max_size=40),
    shuffle=st.booleans(),
)
def test_gathered_spans_are_the_slices(
    data: bytes, cuts: list[tuple[int, int, bool]], shuffle: bool
) -> None:
    """gather() gives each span's bytes: spans in order (Arrow's take), empty spans
    pointing anywhere, and spans out of order or overlapping (the byte-index path)."""
    spans: list[tuple[int, int]] = []
    at = 0
    for gap, length, empty in cuts:
        if empty:
            spans.append((gap % (len(data) + 1), 0))  # an empty span: anywhere
            continue
        start = min(at + gap % 7, len(data))
        length = min(length, len(data) - start)
        spans.append((start, length))
        at = start + length
    if shuffle:
        spans.reverse()
    arr = np.frombuffer(data + b"\0", np.uint8)[: len(data)]
    starts = np.array([s for s, _ in spans], np.int64)
    lengths = np.array([n for _, n in spans], np.int64)
    got = gather(arr, starts, lengths)
    assert got.to_pylist() == [data[s : s + n] for s, n in spans]
    ordered = [s for s in spans if s[1]] == sorted(s for s in spans if s[1])
    if spans and not shuffle:
        assert _wire._taken(arr, starts, lengths, pa.binary()) is not None  # the fast path
    if not ordered:
        assert _wire._taken(arr, starts, lengths, pa.binary()) is None


@pytest.mark.parametrize("ctype", TYPES, ids=lambda t: T.Name(t))
@pytest.mark.parametrize("seed", range(3))
def test_in_flight_values_go_back_to_the_same_values(
    ctype: pb.ColumnType.ValueType, seed: int
) -> None:
    """A snapshot row shaped by transforms goes back to ``Value`` messages
    (subscriber/reinit/shape.py): every in-flight form returns the value it came from."""
    from subscriber.reinit.shape import _backs

    rng = random.Random(seed)
    cells = [_value(ctype, rng) for _ in range(300)]
    col = pb.Column(name="c", type=ctype)
    name, arr = _events._wire_column(0, col, [c.SerializeToString() for c in cells])
    assert name == "c0"
    (back,) = _backs(pb.TableSchema(columns=[col]))
    for cell, x in zip(cells, arr.to_pylist(), strict=True):
        got = values.decode(pb.Value(null=True) if x is None else back(x))
        want = values.decode(cell)
        assert got == want
        if isinstance(want, datetime.datetime):
            assert isinstance(got, datetime.datetime)
            assert got.utcoffset() == want.utcoffset()
