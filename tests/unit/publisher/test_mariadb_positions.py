"""MariaDB GTIDs as capture positions, and the type mapping's refusals (no server)."""

from __future__ import annotations

import pytest

from common.rpc import txrepl_pb2 as pb
from publisher.capture.mariadb._gtid import (
    at_domain,
    domain_of,
    gtid_of,
    parse_gtids,
    position,
    seq_of,
)
from publisher.capture.mariadb._types import ColumnInfo, column_of, refusal
from publisher.errors import SourceError


def test_positions_order_by_seq_and_give_back_the_gtid() -> None:
    """A later seq is a later position whichever server wrote it; the GTID comes back."""
    assert position(7, 100) < position(1, 101) < position(2**32 - 1, 102)
    assert seq_of(position(7, 100)) == 100
    assert gtid_of(0, position(7, 100)) == "0-7-100"
    assert gtid_of(3, position(2**32 - 1, 5)) == "3-4294967295-5"
    assert gtid_of(0, 0) == ""  # the binary log's start
    assert at_domain("0-1-41", 0) == position(1, 41)
    assert at_domain("", 0) == 0


def test_one_domain_is_followed_and_several_are_refused() -> None:
    """The server's one GTID domain (or its default when none yet); two: a clear error."""
    assert domain_of("2-1-9", 0) == 2
    assert domain_of("", 5) == 5
    assert parse_gtids("0-1-9, 1-2-3") == {0: (1, 9), 1: (2, 3)}
    with pytest.raises(SourceError, match=r"GTID domains \[0, 1\]; txrepl follows one"):
        domain_of("0-1-9,1-2-3", 0)
    with pytest.raises(SourceError, match="is not domain-server-seq"):
        parse_gtids("0-1")


def _col(data_type: str, column_type: str) -> ColumnInfo:
    return ColumnInfo("c", data_type, column_type, True, 0, 0)


@pytest.mark.parametrize(
    ("data_type", "column_type", "why"),
    [
        ("bit", "bit(1)", "different forms"),
        ("set", "set('a','b')", "unordered"),
        ("geometry", "geometry", "spatial"),
        ("uuid", "uuid", "stored as binary"),
        ("vector", "vector(3)", "no txrepl type"),
    ],
)
def test_unmapped_types_are_refused_naming_table_column_and_type(
    data_type: str, column_type: str, why: str
) -> None:
    """The refusal names the table, the column, the MariaDB type and why."""
    message = refusal("t", _col(data_type, column_type))
    assert message is not None
    assert f"table 't' column 'c' has type {column_type}" in message
    assert why in message


def test_unsigned_bigint_is_an_exact_decimal_and_other_integers_integers() -> None:
    """bigint unsigned holds more than a signed 64-bit: DECIMAL(20,0); the rest INTEGER."""
    big = column_of(_col("bigint", "bigint(20) unsigned"))
    assert big is not None
    assert (big.type, big.precision, big.scale) == (pb.COLUMN_TYPE_DECIMAL, 20, 0)
    for data_type, column_type in [("int", "int(10) unsigned"), ("tinyint", "tinyint(1)")]:
        col = column_of(_col(data_type, column_type))
        assert col is not None
        assert col.type == pb.COLUMN_TYPE_INTEGER
    assert refusal("t", _col("int", "int(11)")) is None
