"""The pgoutput parser, the wal2json adapter and PostgreSQL text values, without a server."""

from __future__ import annotations

import datetime as dt
import decimal
import struct

import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import decode
from publisher.capture.postgres._pgoutput import (
    PG_EPOCH_US,
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    ProtocolError,
    Relation,
    RelColumn,
    Truncate,
    Update,
    parse_pgoutput,
)
from publisher.capture.postgres._pgtypes import TypeInfo, numeric_typmod, to_value
from publisher.capture.postgres._pgwal2json import Wal2JsonDecoder
from tests.support.pgoutput import tuple_data

T = pb.ColumnType


def _tuple(*cols: str | object | None) -> bytes:
    return tuple_data(cols)


def test_begin_and_commit() -> None:
    """Begin's final LSN and Commit's LSNs and times are decoded (times to the Unix epoch)."""
    b = parse_pgoutput(b"B" + struct.pack(">QqI", 0x1_0000_0028, 1_000_000, 77))
    assert b == Begin(final_lsn=0x1_0000_0028, commit_time_us=PG_EPOCH_US + 1_000_000, xid=77)
    c = parse_pgoutput(b"C" + struct.pack(">bQQq", 0, 0x28, 0x58, 5))
    assert c == Commit(commit_lsn=0x28, end_lsn=0x58, commit_time_us=PG_EPOCH_US + 5)


def test_relation_and_row_messages() -> None:
    """Relation columns, and insert/update/delete tuples with NULL and unchanged TOAST."""
    rel = (
        b"R"
        + struct.pack(">I", 16384)
        + b"public\0acc\0f"
        + struct.pack(">h", 2)
        + b"\x01id\0"
        + struct.pack(">Ii", 23, -1)
        + b"\x00bal\0"
        + struct.pack(">Ii", 1700, (10 << 16 | 2) + 4)
    )
    assert parse_pgoutput(rel) == Relation(
        16384,
        "public",
        "acc",
        "f",
        (RelColumn("id", 23, -1, key=True), RelColumn("bal", 1700, (10 << 16 | 2) + 4)),
    )
    oid = struct.pack(">I", 16384)
    assert parse_pgoutput(b"I" + oid + b"N" + _tuple("1", None)) == Insert(16384, ("1", None))
    upd = parse_pgoutput(b"U" + oid + b"O" + _tuple("1", "x") + b"N" + _tuple("2", UNCHANGED))
    assert upd == Update(16384, ("1", "x"), ("2", UNCHANGED))
    assert parse_pgoutput(b"U" + oid + b"N" + _tuple("1", "y")) == Update(16384, None, ("1", "y"))
    assert parse_pgoutput(b"D" + oid + b"K" + _tuple("1", None)) == Delete(16384, ("1", None))
    trunc = parse_pgoutput(b"T" + struct.pack(">ibII", 2, 3, 1, 2))
    assert trunc == Truncate((1, 2), cascade=True, restart_identity=True)


def test_ignored_and_malformed_messages() -> None:
    """Origin/type messages are skipped; truncated or unknown ones raise ProtocolError."""
    assert parse_pgoutput(b"Y" + struct.pack(">I", 1) + b"s\0t\0") is None
    with pytest.raises(ProtocolError):
        parse_pgoutput(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"t\0")
    with pytest.raises(ProtocolError):
        parse_pgoutput(b"Z")
    with pytest.raises(ProtocolError):
        parse_pgoutput(b"")
    with pytest.raises(ProtocolError, match="binary"):
        parse_pgoutput(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"b")
    # a text value said to be longer than what is left: refused, not cut short
    short = b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"t"
    with pytest.raises(ProtocolError, match="ends early"):
        parse_pgoutput(short + struct.pack(">i", 10) + b"abc")
    with pytest.raises(ProtocolError, match="ends early"):  # fewer cells than announced
        parse_pgoutput(short.replace(struct.pack(">h", 1), struct.pack(">h", 2)) + b"\0\0\0\1x")


@pytest.mark.parametrize(
    ("ctype", "scale", "text", "expected"),
    [
        (T.COLUMN_TYPE_INTEGER, 0, "-9223372036854775808", -(2**63)),
        (T.COLUMN_TYPE_DECIMAL, 2, "12.30", decimal.Decimal("12.30")),
        (T.COLUMN_TYPE_DECIMAL, 0, "NaN", decimal.Decimal("NaN")),
        (T.COLUMN_TYPE_FLOAT, 0, "0.30000000000000004", 0.30000000000000004),
        (T.COLUMN_TYPE_BYTES, 0, "\\x00ff", b"\x00\xff"),
        (T.COLUMN_TYPE_BOOLEAN, 0, "f", False),
        (T.COLUMN_TYPE_DATE, 0, "2024-02-29", dt.date(2024, 2, 29)),
        (T.COLUMN_TYPE_DATE, 0, "infinity", "infinity"),  # kept as text, not lost
        (T.COLUMN_TYPE_TIME, 0, "24:00:00", "24:00:00"),
        (
            T.COLUMN_TYPE_TIMESTAMP,
            0,
            "2024-01-02 03:04:05.5",
            dt.datetime(2024, 1, 2, 3, 4, 5, 500000),
        ),
        (
            T.COLUMN_TYPE_TIMESTAMPTZ,
            0,
            "2024-01-02 03:04:05+00",
            dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        ),
        (T.COLUMN_TYPE_JSON, 0, '{"a": 1}', '{"a": 1}'),
    ],
)
def test_text_values_round_trip(ctype: int, scale: int, text: str, expected: object) -> None:
    """Text output of each type becomes the exact Value of its logical type."""
    got = decode(to_value(text, TypeInfo(ctype, 0, scale, "x")))
    assert repr(got) == repr(expected)  # repr: Decimal NaN is not equal to itself


def test_numeric_typmod() -> None:
    """numeric(p,s) typmods decode; unconstrained numeric is (0, 0)."""
    assert numeric_typmod((12 << 16 | 3) + 4) == (12, 3)
    assert numeric_typmod(-1) == (0, 0)


def test_wal2json_messages_become_events() -> None:
    """wal2json v2: relation synthesised once per column list, literals kept exact."""
    dec = Wal2JsonDecoder()
    begin = list(dec.decode(b'{"action":"B","timestamp":"2024-01-01 00:00:00+00","lsn":"0/28"}'))
    assert begin == [Begin(0x28, 1_704_067_200_000_000, 0)]
    ins = (
        b'{"action":"I","schema":"public","table":"t","columns":['
        b'{"name":"id","type":"integer","typeoid":23,"value":1},'
        b'{"name":"n","type":"numeric(5,2)","typeoid":1700,"value":1.50},'
        b'{"name":"b","type":"bytea","typeoid":17,"value":"00ff"},'
        b'{"name":"ok","type":"boolean","typeoid":16,"value":true}]}'
    )
    rel, row = dec.decode(ins)
    assert isinstance(rel, Relation)
    assert [c.typmod for c in rel.columns] == [-1, (5 << 16 | 2) + 4, -1, -1]
    assert row == Insert(rel.oid, ("1", "1.50", "\\x00ff", "t"))
    assert next(iter(dec.decode(ins))) == Insert(rel.oid, ("1", "1.50", "\\x00ff", "t"))
    upd = (
        b'{"action":"U","schema":"public","table":"t","columns":['
        b'{"name":"id","type":"integer","typeoid":23,"value":2}],"identity":['
        b'{"name":"id","type":"integer","typeoid":23,"value":1},'
        b'{"name":"n","type":"numeric(5,2)","typeoid":1700,"value":1.50},'
        b'{"name":"b","type":"bytea","typeoid":17,"value":"00ff"},'
        b'{"name":"ok","type":"boolean","typeoid":16,"value":false}]}'
    )
    (ev,) = dec.decode(upd)  # same column list: no new relation; omitted = unchanged TOAST
    assert ev == Update(
        rel.oid, ("1", "1.50", "\\x00ff", "f"), ("2", UNCHANGED, UNCHANGED, UNCHANGED)
    )
    (t,) = dec.decode(b'{"action":"T","schema":"public","table":"t"}')
    assert t == Truncate((rel.oid,), cascade=False, restart_identity=False)
    commit = b'{"action":"C","timestamp":"2024-01-01 00:00:00+00","lsn":"0/28","nextlsn":"0/58"}'
    assert list(dec.decode(commit)) == [Commit(0x28, 0x58, 1_704_067_200_000_000)]
    with pytest.raises(ProtocolError):
        list(dec.decode(b"{not json"))


@pytest.mark.parametrize(
    ("ctype", "scale", "value", "text"),
    [
        (T.COLUMN_TYPE_INTEGER, 0, 42, "42"),
        (T.COLUMN_TYPE_DECIMAL, 3, decimal.Decimal("1.5"), "1.500"),
        (T.COLUMN_TYPE_DECIMAL, 0, decimal.Decimal("0.0000001"), "0.0000001"),
        (T.COLUMN_TYPE_FLOAT, 0, 1e300, "1e+300"),
        (T.COLUMN_TYPE_TEXT, 0, "ü", "ü"),
        (T.COLUMN_TYPE_BYTES, 0, b"\x01", "\\x01"),
        (T.COLUMN_TYPE_BOOLEAN, 0, True, "t"),
        (T.COLUMN_TYPE_DATE, 0, dt.date(1969, 12, 31), "1969-12-31"),
        (T.COLUMN_TYPE_TIME, 0, dt.time(1, 2, 3, 4), "01:02:03.000004"),
        (T.COLUMN_TYPE_TIMESTAMP, 0, dt.datetime(1900, 1, 1), "1900-01-01 00:00:00"),
        (
            T.COLUMN_TYPE_TIMESTAMPTZ,
            0,
            dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
            "2000-01-01 00:00:00+00",
        ),
        (T.COLUMN_TYPE_JSON, 0, "[1]", "[1]"),
    ],
)
def test_fast_encoder_matches_common_encode(
    ctype: int, scale: int, value: object, text: str
) -> None:
    """The capture's direct text encoder gives the very Value common.values.encode gives."""
    from common.values import encode

    assert to_value(text, TypeInfo(ctype, 0, scale, "x")) == encode(value, ctype, scale)
