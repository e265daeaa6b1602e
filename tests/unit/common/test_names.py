"""Table names as the configuration writes them and entries carry them (common/names.py)."""

from __future__ import annotations

import pytest

from common.names import TableRef, format_table, parse_table


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("orders", TableRef(None, "orders")),
        ("Sales.Order Items", TableRef("Sales", "Order Items")),
        ('"Sales"."Order Items"', TableRef("Sales", "Order Items")),
        ('"a.b"', TableRef(None, "a.b")),
        ('Sales."x""y"', TableRef("Sales", 'x"y')),
        ('"my.schema"."select"', TableRef("my.schema", "select")),
    ],
)
def test_a_name_reads_as_its_schema_and_table_and_has_one_form(text: str, ref: TableRef) -> None:
    """Parts are exact (case, spaces); a quoted part may hold dots and doubled quotes;
    the written form reads back as the same name."""
    assert parse_table(text) == ref
    assert parse_table(format_table(ref.schema, ref.name)) == ref


def test_the_written_form_quotes_only_parts_that_need_it() -> None:
    """Names without dots or quotes are written as they are (as logs always had them)."""
    assert format_table(None, "Order Items") == "Order Items"
    assert format_table("Sales", "Order Items") == "Sales.Order Items"
    assert format_table(None, 'we"ird.T') == '"we""ird.T"'
    assert TableRef("Sales", "a.b").flat == "Sales.a.b"


@pytest.mark.parametrize("text", ["", "a.b.c", "a.", ".a", '"a', '"a"b', 'a"b', '"a"."b".c'])
def test_a_name_that_is_not_one_is_refused_saying_how_to_write_it(text: str) -> None:
    """One line naming the table and how to write it."""
    with pytest.raises(ValueError, match="table"):
        parse_table(text)
