"""The driver-side net effect of small batches equals Spark's, key type by key type."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from subscriber.apply._events import net_effect_positions
from subscriber.apply._small import net_effect_positions_local, supported

pytestmark = pytest.mark.spark

# Few distinct values per type, so keys repeat and the last event must win.
KEY_VALUES = {
    "int": (pa.int64(), st.sampled_from([None, -1, 0, 7, 2**40])),
    "text": (pa.string(), st.sampled_from([None, "", "a", "é", "a "])),
    "bytes": (pa.binary(), st.sampled_from([None, b"", b"\x00", b"ab"])),
    "float": (pa.float64(), st.sampled_from([None, 0.0, -0.0, 1.5, math.nan, -math.nan])),
    "bool": (pa.bool_(), st.sampled_from([None, True, False])),
    "date": (pa.date32(), st.sampled_from([None, 0, 19000])),
    "tstz": (
        pa.struct([("utc_us", pa.int64()), ("offset_s", pa.int64())]),
        st.sampled_from([None, {"utc_us": 1, "offset_s": 0}, {"utc_us": 1, "offset_s": 3600}]),
    ),
}


@st.composite
def segments(draw: st.DrawFn) -> list[pa.Table]:
    out = []
    pos = 0
    for _ in range(draw(st.integers(1, 3))):
        kinds = draw(st.lists(st.sampled_from(sorted(KEY_VALUES)), min_size=1, max_size=2))
        n = draw(st.integers(0, 25))
        cols: dict[str, pa.Array] = {"_pos": pa.array(np.arange(pos, pos + n), pa.int64())}
        pos += n
        for j, kind in enumerate(kinds):
            atype, values = KEY_VALUES[kind]
            cols[f"c{j}"] = pa.array([draw(values) for _ in range(n)], atype)
        out.append(pa.table(cols))
    return out


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(segs=segments())
@example(  # PySpark dropped this row: an Arrow table of chunks of 0, 0 and 1 rows
    segs=[
        pa.table({"_pos": pa.array(p, pa.int64()), "c0": pa.array(k, pa.bool_())})
        for p, k in (([], []), ([], []), ([0], [None]))
    ]
)
@example(  # one integer key without NULLs (computed in numpy), keys repeated
    segs=[
        pa.table({"_pos": pa.array([0, 1, 2, 3, 4], pa.int64()),
                  "c0": pa.array([7, -1, 7, 2**40, -1], pa.int64())}),
        pa.table({"_pos": pa.array([5, 6], pa.int64()), "c0": pa.array([3, 3], pa.int32())}),
    ]
)  # fmt: skip
def test_local_net_effect_is_sparks(spark, segs: list[pa.Table]) -> None:
    assert supported(segs)
    local = net_effect_positions_local(segs)
    remote = net_effect_positions(spark, [s for s in segs])
    assert [(p.tolist(), f.tolist()) for p, f in local] == [
        (p.tolist(), f.tolist()) for p, f in remote
    ]
    for last, first in local:
        assert (first <= last).all()


def test_tables_of_empty_and_full_chunks_reach_spark_whole(spark) -> None:
    """Every row of a table made of several chunks, some empty, reaches Spark."""
    from subscriber.apply.session import arrow_frame

    part = [pa.table({"a": pa.array(v, pa.int64())}) for v in ([], [], [5], [], [6, 7])]
    table = pa.concat_tables(part)
    assert table.column("a").num_chunks == 5
    assert sorted(r.a for r in arrow_frame(spark, table).collect()) == [5, 6, 7]


def test_unsupported_key_types_are_left_to_spark() -> None:
    keys = pa.table(
        {"_pos": pa.array([0], pa.int64()), "c0": pa.array([[1]], pa.list_(pa.int64()))}
    )
    assert not supported([keys])
