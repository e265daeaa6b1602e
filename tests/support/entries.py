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
