"""A DECIMAL value is encoded at its column's scale however many digits that takes:
Python's default decimal context stops at 28 and made such values fail the capture."""

from __future__ import annotations

import decimal

import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import encode, to_decimal

BIG = [
    (decimal.Decimal("12345678901234567890123456789012345.123456789012345678901234567891"), 30),
    (decimal.Decimal(-(10**40) + 1), 12),  # a MariaDB DECIMAL(65,30)-sized integer part
    (6605533386098690529, 12),  # a SQLite integer in a DECIMAL(30,12) column
    (1e22, 12),
]


@pytest.mark.parametrize(("value", "scale"), BIG)
def test_a_long_decimal_keeps_every_digit_at_its_scale(value: object, scale: int) -> None:
    got = to_decimal(value, scale)
    assert got is not None
    exact = decimal.Decimal(repr(value) if isinstance(value, float) else str(value))
    assert got.as_tuple().exponent == -scale
    # the value itself, rounded half-even at the scale (here: nothing lost but the 31st decimal)
    assert abs(got - exact) <= decimal.Decimal(1).scaleb(-scale) / 2
    assert encode(value, pb.COLUMN_TYPE_DECIMAL, scale).decimal == str(got)


def test_the_scale_rounds_half_even_as_before() -> None:
    assert to_decimal(decimal.Decimal("2.675"), 2) == decimal.Decimal("2.68")
    assert to_decimal(decimal.Decimal("2.665"), 2) == decimal.Decimal("2.66")
    assert str(to_decimal(5, 3)) == "5.000"
