"""The snapshot's in-place value writers encode exactly as ``common.values.encode``."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import encode
from publisher.capture.values import value_writer

SAMPLES: list[object] = [
    None,
    0,
    -5,
    2**62,
    True,
    False,
    1.5,
    3.0,
    float("inf"),
    "",
    "text",
    " 12.30 ",
    "12.345",
    "abc",
    "2026-01-02T03:04:05",
    "2026-01-02T03:04:05.123456+02:00",
    "2026-01-02",
    "10:11:12",
    b"\x00\x01",
    decimal.Decimal("1.005"),
    dt.datetime(2026, 1, 2, 3, 4, 5),
    dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
    dt.date(2026, 1, 2),
]

TYPES = [
    (pb.COLUMN_TYPE_UNSPECIFIED, 0),
    (pb.COLUMN_TYPE_INTEGER, 0),
    (pb.COLUMN_TYPE_FLOAT, 0),
    (pb.COLUMN_TYPE_TEXT, 0),
    (pb.COLUMN_TYPE_DECIMAL, 0),
    (pb.COLUMN_TYPE_DECIMAL, 2),
    (pb.COLUMN_TYPE_TIMESTAMP, 0),
    (pb.COLUMN_TYPE_TIMESTAMPTZ, 0),
    (pb.COLUMN_TYPE_DATE, 0),
    (pb.COLUMN_TYPE_BYTES, 0),
    (pb.COLUMN_TYPE_BOOLEAN, 0),
    (pb.COLUMN_TYPE_JSON, 0),
]


@pytest.mark.parametrize(("ctype", "scale"), TYPES)
def test_value_writer_matches_encode(ctype: int, scale: int) -> None:
    write = value_writer(ctype, scale)
    for v in SAMPLES:
        out = pb.Value()
        write(out, v)
        assert out == encode(v, ctype, scale), (ctype, scale, v)
