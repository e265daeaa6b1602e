"""SQLite capture's wire bytes (publisher/capture/sqlite/wire.py) equal what the
protobuf objects of exact.py serialize to, for every column type and every storage
class SQLite can hand over, extremes included: a differential over a seeded
generator, the objects as the oracle."""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from common.rpc import txrepl_pb2 as pb
from publisher.capture.protowire import length
from publisher.capture.sqlite import SqliteCapture
from publisher.capture.sqlite.exact import encode_stored
from publisher.capture.sqlite.images import decode_image
from publisher.capture.sqlite.wire import image_fields, row_op, table_field, value_bytes

TYPES = [t for t in pb.ColumnType.values() if t != pb.COLUMN_TYPE_UNSPECIFIED] + [
    pb.COLUMN_TYPE_UNSPECIFIED
]

EDGES: list[object] = [
    None, 0, 1, -1, 127, 128, -128, 2**31, -(2**31), 2**53, 2**53 + 1, -(2**53) - 1,
    2**63 - 1, -(2**63), True, False, 0.0, -0.0, 1.5, -2.25, 1e300, -1e-300,
    float("inf"), float("-inf"), 5e-324, "", "a", "é", "x" * 200, "\x00nul",
    "bad \udcff utf-8", "2024-02-29", "2024-02-29T12:34:56", "2024-02-29T12:34:56+02:00",
    "12:34:56", "12.30", "1e5", "1970-01-01T00:00:00+00:00", "1969-12-31T23:00:00-01:00",
    "2024-02-29T12:34:56.123456-05:30", "0001-01-01T00:00:00+14:00", "2024-02-29T12:34:56Z",
    "9999-12-31T23:59:59.999999-12:00", "2024-02-29T12:34:56+05:30:15", 12.345, 0.1, 1e20,
    2.5e-7, 99999999999.99, -0.005,
    # near misses of isoformat's form (wire.py reads that form by slicing)
    "2024-02-29T12:34:56-00:00", "2024-02-29T12:34:56.000000+00:00", "2024-02-29 12:34:56+00:00",
    "2024-02-29T12:34:60+00:00", "2024-02-29T24:00:00+00:00", "2024-02-29T12:34:5\u0663+00:00",
    "2024-02-29T12:34:56+24:00", "2024-02-29t12:34:56+00:00", "2024-W09-4T12:34:56+00:00",
    "2024-02-29T12:34:56.12345+00:00", "2024-02-30T12:34:56+00:00", "2024-02-29T12:34:56+00:60",
    "2024-02-29T12:34:56.1234567+00:00", "2024-02-29T12:34:56 00:00", "2024-02-29T12:34:-1+00:00",
    "2024-02-29T12:34:56.-12345+00:00", "0001-01-01T00:00:00-00:01", "9999-12-31T23:59:59+00:00",
    "2024-02-29T12:34+00:00:00", "2024-02-29T1:34:56+00:00:0", "2024-02-29T12:34:56+0\u0663:00",
    "true", "[1, 2]", '{"a": 1}', b"", b"\x00\xff", b"x" * 300,
]  # fmt: skip


def _random_instant(rng: random.Random) -> str:
    """ISO text of a random aware (sometimes naive) time, as applications write it."""
    zone = dt.timezone(dt.timedelta(minutes=rng.randrange(-14 * 60, 14 * 60 + 1, 15)))
    at = dt.datetime(1, 1, 2, tzinfo=dt.UTC) + dt.timedelta(
        microseconds=rng.randrange(0, 315_000_000_000_000_000)
    )
    local = at.astimezone(zone).replace(microsecond=rng.choice([0, at.microsecond]))
    return local.isoformat() if rng.random() < 0.9 else local.replace(tzinfo=None).isoformat()


def _random_value(rng: random.Random) -> object:
    kind = rng.randrange(7)
    if kind == 5:
        return _random_instant(rng)
    if kind == 0:
        return rng.randrange(-(2**63), 2**63)
    if kind == 1:
        digits = rng.randrange(0, 9)  # a price, a rate: few decimals (wire.py's DECIMAL form)
        return rng.choice([rng.uniform(-1e6, 1e6), round(rng.uniform(-1e4, 1e4), digits)])
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


def _fields(values: list[object], types: Sequence[tuple[int, int]], tag: bytes) -> bytes:
    wire = (value_bytes(v, *ts) for v, ts in zip(values, types, strict=False))
    return b"".join(length(tag, v) for v in wire)


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
            table_field(table.encode()),
            int(op),
            _fields(key, types, b"\x1a") if has_key else None,
            _fields(row, types, b"\x22") if has_row else None,
        )
        assert pb.Op.FromString(got) == want
        assert got == want.SerializeToString()


# One column per declared type the capture maps (publisher/capture/sqlite/mapping.py),
# and one without a declared type; any value goes into any of them (SQLite's affinity).
DECLARED = [
    "INTEGER", "BIGINT", "REAL", "DOUBLE", "DECIMAL(12,2)", "NUMERIC", "TEXT", "VARCHAR(5)",
    "DECIMAL(18,6)", "DECIMAL(20,7)", "DECIMAL(30,12)", "DECIMAL(3,1)",
    "BLOB", "BOOLEAN", "DATE", "TIME", "TIMESTAMP", "TIMESTAMPTZ", "JSON", "",
]  # fmt: skip


def test_images_captured_by_sqlite_become_the_same_bytes(tmp_path: Path) -> None:
    """Real row images written by the capture triggers: ``image_fields`` gives what
    reading them (images.py) and encoding each value (exact.py) gives, each Value
    inside its key or row field."""
    src = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    cols = ", ".join(f"c{i} {d}" for i, d in enumerate(DECLARED))
    src.execute(f"CREATE TABLE t(id INTEGER PRIMARY KEY, {cols})")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["t"])
    rng = random.Random(11)
    for i in range(400):
        values = [_random_value(rng) for _ in DECLARED]
        marks: list[str] = []
        params: list[object] = []
        for v in values:
            if isinstance(v, str) and not v.isascii() and "\udcff" in v:  # TEXT, not UTF-8
                marks.append("CAST(? AS TEXT)")
                params.append(v.encode("utf-8", "surrogateescape"))
            else:
                marks.append("?")
                params.append(v)
        src.execute(f"INSERT INTO t VALUES (?, {', '.join(marks)})", [i, *params])
    src.execute("UPDATE t SET c0 = c0 WHERE id % 3 = 0")  # updates carry a key image
    src.execute("DELETE FROM t WHERE id % 7 = 0")
    shape = cap._shape(None, "t")
    rows = [r for r in cap.read(0) if r.op in ("I", "U", "D")]
    assert len(rows) > 500
    for r in rows:
        for image, types in ((r.k, shape.key_types), (r.v, shape.types)):
            if image is None:
                continue
            for tag in (b"\x1a", b"\x22"):
                want = b"".join(
                    length(tag, encode_stored(x, *ts).SerializeToString())
                    for x, ts in zip(decode_image(image), types, strict=False)
                )
                assert image_fields(image, types, tag) == want, r


@pytest.mark.parametrize("scale", range(13))
def test_decimal_reals_written_by_quote_become_the_same_decimal_text(
    tmp_path: Path, scale: int
) -> None:
    """A DECIMAL column's reals as quote() writes them (wire.py reads the plain ones as
    text): zeros, signs, every count of decimals around the scale, 15 to 17 digits."""
    src = sqlite3.connect(str(tmp_path / "src.db"), isolation_level=None)
    src.execute(f"CREATE TABLE t(id INTEGER PRIMARY KEY, d DECIMAL(30,{scale}))")
    cap = SqliteCapture(tmp_path / "src.db")
    cap.install("p", "inc-1", ["t"])
    rng = random.Random(scale)
    values: list[object] = [0.0, -0.0, 0.5, -0.5, 0.1, 1e15, 123456789012345.0, 1e-4, 1e-5]
    values += [9.999999, 99999999999999.9, 0.30000000000000004, 1 / 3, 2.5e-7, 1e22]
    for _ in range(300):
        digits = rng.randrange(0, 17)
        values.append(round(rng.uniform(-(10.0 ** rng.randrange(0, 15)), 1e6), digits))
    src.executemany("INSERT INTO t(d) VALUES (?)", [(v,) for v in values])
    shape = cap._shape(None, "t")
    rows = [r for r in cap.read(0) if r.op == "I"]
    assert len(rows) == len(values)
    for r in rows:
        want = b"".join(
            length(b"\x22", encode_stored(x, *ts).SerializeToString())
            for x, ts in zip(decode_image(r.v), shape.types, strict=False)
        )
        assert image_fields(r.v, shape.types, b"\x22") == want, r


@pytest.mark.parametrize(
    "literal", ["1234567890123456.7", "123456789012345.67", "0.1000000000000000055", "-1.5", "7.0"]
)
def test_a_plain_real_of_many_digits_is_read_as_its_double(literal: str) -> None:
    """Past 15 digits a plain literal (quote() prints such reals as exponents today) is
    not the double's shortest text: its Value comes from the double, not the text."""
    for scale in range(1, 7):
        types = [(int(pb.COLUMN_TYPE_DECIMAL), scale)]
        want = length(b"\x22", encode_stored(float(literal), *types[0]).SerializeToString())
        assert image_fields(f"{literal},".encode(), types, b"\x22") == want, scale
