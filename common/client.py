"""A small Python client for application-controlled publishing (the ``Publish`` RPC).

    with PublishClient("pub.example:7400", tls=ClientTls(ca_file="ca.crt"),
                       token_file="secrets/publish.token") as client:
        seq = client.publish("shop", [
            schema_op("notes", [("id", "integer"), ("body", "text")], ["id"]),
            insert_op("notes", [1, "hello"]),
            sql_op("REFRESH MATERIALIZED VIEW totals"),
            call_op("recalc", [42]),
        ])

Everything in one ``publish`` call becomes ONE entry (one seq), applied by every
subscriber in one target transaction.  The channel comes from the one client builder,
``common.security.client_channel``: TLS (mutual with ``cert_file``/``key_file``) when
``tls`` is given, the token (``token``, or read from ``token_file``) on every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import grpc

from common.errors import PermanentError, TransientError, describe_rpc_error, is_transient
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import ClientTls, client_channel, read_token_file
from common.values import encode, parse_declared_type

__all__ = [
    "ClientTls",
    "PublishClient",
    "call_op",
    "delete_op",
    "insert_op",
    "schema_op",
    "sql_op",
    "update_op",
]


def schema_op(table: str, columns: Sequence[tuple[str, str]], primary_key: Sequence[str]) -> pb.Op:
    """A table definition; column types are SQL spellings ("numeric(12,2)", "text", ...)."""
    op = pb.Op()
    op.schema.table = table
    for name, decl in columns:
        ctype, prec, scale = parse_declared_type(decl)
        op.schema.columns.add(
            name=name,
            type=ctype,
            precision=prec,
            scale=scale,
            nullable=name not in primary_key,
            source_type=decl,
        )
    op.schema.primary_key.extend(primary_key)
    return op


def _row(
    table: str, kind: pb.RowOp.ValueType, key: Sequence[object], row: Sequence[object]
) -> pb.Op:
    op = pb.Op()
    op.row.table = table
    op.row.op = kind
    op.row.key.extend(encode(v) for v in key)
    op.row.row.extend(encode(v) for v in row)
    return op


def insert_op(table: str, row: Sequence[object]) -> pb.Op:
    return _row(table, pb.ROW_OP_INSERT, (), row)


def update_op(table: str, key: Sequence[object], row: Sequence[object]) -> pb.Op:
    return _row(table, pb.ROW_OP_UPDATE, key, row)


def delete_op(table: str, key: Sequence[object]) -> pb.Op:
    return _row(table, pb.ROW_OP_DELETE, key, ())


def sql_op(sql: str) -> pb.Op:
    op = pb.Op()
    op.sql.sql = sql
    return op


def call_op(name: str, args: Sequence[object]) -> pb.Op:
    op = pb.Op()
    op.call.name = name
    op.call.args.extend(encode(a) for a in args)
    return op


class PublishClient:
    """Appends entries through the ``Publish`` RPC.

    ``token_file``: a file holding the publish token (a ConfigError naming it when it
    cannot be read); ``tls``: None for plaintext (loopback).
    """

    def __init__(
        self,
        address: str,
        *,
        token: str = "",
        token_file: str | Path = "",
        tls: ClientTls | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if token and token_file:
            raise ValueError("PublishClient: give token or token_file, not both")
        if token_file:
            token = read_token_file(Path(token_file), "token_file")
        self._channel = client_channel(address, tls, token=token)
        self._stub = rpc.ReplicationStub(self._channel)
        self._timeout = timeout_s

    def publish(self, publication: str, ops: Sequence[pb.Op]) -> int:
        """Append ``ops`` as one entry; returns its seq."""
        try:
            resp = self._stub.Publish(
                pb.PublishRequest(publication=publication, ops=list(ops)),
                timeout=self._timeout,
            )
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            err = TransientError if is_transient(code) else PermanentError
            raise err(f"publish to {publication!r} failed: {describe_rpc_error(e)}") from e
        return int(resp.seq)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PublishClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
