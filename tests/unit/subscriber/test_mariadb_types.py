"""The MariaDB target's type mapping and URL, without a server (subscriber/targets/mariadb)."""

from __future__ import annotations

import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import SchemaError
from subscriber.targets.mariadb._conn import connect_args
from subscriber.targets.mariadb._types import check_schema, column_sql

T = pb.ColumnType


@pytest.mark.parametrize(
    ("column", "key", "spelled"),
    [
        (pb.Column(type=T.COLUMN_TYPE_DECIMAL, precision=12, scale=2), False, "DECIMAL(12,2)"),
        (pb.Column(type=T.COLUMN_TYPE_DECIMAL, precision=70, scale=2), False, "LONGTEXT"),
        (pb.Column(type=T.COLUMN_TYPE_DECIMAL), True, "VARCHAR(255)"),
        (pb.Column(type=T.COLUMN_TYPE_TEXT), True, "VARCHAR(255)"),
        (pb.Column(type=T.COLUMN_TYPE_BYTES), True, "VARBINARY(255)"),
        (pb.Column(type=T.COLUMN_TYPE_BYTES), False, "LONGBLOB"),
        (pb.Column(type=T.COLUMN_TYPE_TIMESTAMPTZ), False, "DATETIME(6)"),
        (pb.Column(type=T.COLUMN_TYPE_UNSPECIFIED, pg_type="uuid"), False, "LONGTEXT"),
    ],
)
def test_column_types(column: pb.Column, key: bool, spelled: str) -> None:
    """docs/types.md's MariaDB column per logical type; keys get indexable types."""
    assert column_sql(column, key=key).split(" CHARACTER SET")[0] == spelled


def test_text_compares_byte_for_byte() -> None:
    """Text columns are binary and unpadded: 'a' and 'a ' are two keys, as on the source."""
    assert column_sql(pb.Column(type=T.COLUMN_TYPE_TEXT), key=True).endswith("utf8mb4_nopad_bin")


def test_a_too_long_table_name_is_refused() -> None:
    schema = pb.TableSchema(
        table="t" * 65, columns=[pb.Column(name="id", type=T.COLUMN_TYPE_INTEGER)]
    )
    with pytest.raises(SchemaError, match="at most 64 characters"):
        check_schema(schema)


def test_url_to_connection_arguments() -> None:
    """Host, port, user, password (unquoted), database; a socket by ?unix_socket=."""
    args = connect_args("mariadb://app:p%40ss@db.local:3307/shop")
    assert (args["host"], args["port"], args["user"], args["password"], args["database"]) == (
        "db.local",
        3307,
        "app",
        "p@ss",
        "shop",
    )
    args = connect_args("mysql://root@localhost/shop?unix_socket=/run/mysqld/mysqld.sock")
    assert args["unix_socket"] == "/run/mysqld/mysqld.sock"
    assert "host" not in args
    with pytest.raises(ValueError, match="name the database"):
        connect_args("mariadb://root@localhost")
