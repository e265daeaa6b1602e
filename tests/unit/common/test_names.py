"""Table names as the configuration writes them and entries carry them (common/names.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import ConfigError
from common.names import TableRef, format_table, parse_table
from publisher.config import load_config as load_publisher
from subscriber.config import load_config as load_subscriber


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


def test_configs_refuse_a_table_name_that_is_not_one(tmp_path: Path) -> None:
    """A publication's table, and a subscriber's ``[apply.tables]`` key and ``target``,
    are read as names: a bad one stops the config load with one line naming the file,
    the key and how to write it; a quoted name with a dot loads."""
    pub = tmp_path / "p.toml"
    sub = tmp_path / "s.toml"
    pub_text = (
        'server_name = "pub1"\nsource = "sqlite:///src.db"\n'
        '[[publication]]\nname = "shop"\ntables = [{}]\n'
    )
    sub_text = 'server_name = "sub1"\ntarget = "sqlite:///t.db"\n[apply.tables.{}]\ntarget = {}\n'
    pub.write_text(pub_text.replace("{}", "'Sales.\"Order.Items\"'"))
    assert load_publisher(pub).publication[0].tables == ['Sales."Order.Items"']
    for bad in ["'a.b.c'", "'Sales.\"Order'"]:
        pub.write_text(pub_text.replace("{}", bad))
        with pytest.raises(ConfigError, match=r"publication\[0\].*write `name` or `schema.name`"):
            load_publisher(pub)
    for key, target in [("'a.b.c'", "''"), ("orders", "'x.\"y'")]:
        sub.write_text(sub_text.format(key, target))
        with pytest.raises(ConfigError, match=r"apply.*table"):
            load_subscriber(sub)
