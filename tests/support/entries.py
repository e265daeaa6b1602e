"""Entries and ops for apply tests: a small typed schema and op builders."""

from __future__ import annotations

from common import values
from common.rpc import txrepl_pb2 as pb

T = pb.ColumnType


INC = "incarnation-1"


def col(name: str, ctype: int, nullable: bool = True, scale: int = 0) -> pb.Column:
    return pb.Column(name=name, type=ctype, nullable=nullable, scale=scale)  # type: ignore[arg-type]


ITEMS = pb.TableSchema(
    table="items",
    columns=[
        col("id", T.COLUMN_TYPE_INTEGER, nullable=False),
        col("name", T.COLUMN_TYPE_TEXT),
        col("price", T.COLUMN_TYPE_DECIMAL, scale=2),
    ],
    primary_key=["id"],
)


# One column of every logical type, keyed by the text column "k" (typed_schema).
TYPED_COLUMNS = (
    ("k", T.COLUMN_TYPE_TEXT),
    ("i", T.COLUMN_TYPE_INTEGER),
    ("d", T.COLUMN_TYPE_DECIMAL),
    ("f", T.COLUMN_TYPE_FLOAT),
    ("b", T.COLUMN_TYPE_BYTES),
    ("bo", T.COLUMN_TYPE_BOOLEAN),
    ("da", T.COLUMN_TYPE_DATE),
    ("ti", T.COLUMN_TYPE_TIME),
    ("ts", T.COLUMN_TYPE_TIMESTAMP),
    ("tz", T.COLUMN_TYPE_TIMESTAMPTZ),
    ("j", T.COLUMN_TYPE_JSON),
)


def typed_schema(table: str, only: tuple[str, ...] = ()) -> pb.TableSchema:
    """``table`` with the columns of :data:`TYPED_COLUMNS` (``only``: those named, in
    :data:`TYPED_COLUMNS` order), all nullable but the key ``k``."""
    return pb.TableSchema(
        table=table,
        columns=[
            col(name, ctype, nullable=name != "k")
            for name, ctype in TYPED_COLUMNS
            if not only or name in only
        ],
        primary_key=["k"],
    )


def schema_op(schema: pb.TableSchema) -> pb.Op:
    return pb.Op(schema=schema)


def ins(table: str, *row: object) -> pb.Op:
    return pb.Op(
        row=pb.RowChange(table=table, op=pb.ROW_OP_INSERT, row=[values.encode(v) for v in row])
    )


def upd(table: str, key: tuple[object, ...], *row: object) -> pb.Op:
    return pb.Op(
        row=pb.RowChange(
            table=table,
            op=pb.ROW_OP_UPDATE,
            key=[values.encode(v) for v in key],
            row=[values.encode(v) for v in row],
        )
    )


def dele(table: str, *key: object) -> pb.Op:
    return pb.Op(
        row=pb.RowChange(table=table, op=pb.ROW_OP_DELETE, key=[values.encode(v) for v in key])
    )


def entry(*ops: pb.Op) -> pb.Entry:
    return pb.Entry(commit_time_us=1, source_position="p", ops=list(ops))
