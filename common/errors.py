"""Errors shared by both daemons and the CLI.

    TxreplError                  root of every error txrepl raises on purpose
    ├── TransientError           worth retrying (connection lost, lock timeout, busy)
    ├── PermanentError           retrying will not help; stop and tell the operator
    ├── ListenError              a port cannot be bound (busy, not available), naming the key
    └── ConfigError              bad configuration, naming file and key (common.config)
        └── UnreadableFileError  a file an option or key names cannot be read

The ``txrepl`` command turns each operator error into one line and an exit
status of its class (common.exits, docs/operations.md "Exit statuses").

Each package roots its own tree here and draws it in its ``errors.py``:
``publisher.errors`` (capture, feeds), ``publisher.log.errors`` (the log),
``subscriber.errors`` (the connection loop), ``subscriber.apply.errors`` (the
apply and its targets).  An error that may pass by retrying also derives from
:class:`TransientError`, whichever tree it belongs to.

gRPC errors are translated here for people: :func:`describe_rpc_error`.
"""

from __future__ import annotations

import grpc

__all__ = [
    "MAX_NAME",
    "ListenError",
    "PermanentError",
    "TransientError",
    "TxreplError",
    "describe_rpc_error",
    "is_transient",
    "overlong",
]


class TxreplError(Exception):
    """Base of txrepl's own errors."""


class TransientError(TxreplError):
    """A failure that may pass: retry with backoff."""


class PermanentError(TxreplError):
    """A failure that will not pass by retrying: stop and tell the operator."""


class ListenError(TxreplError):
    """A daemon cannot listen where its config says: the port is taken or not available."""

    def __init__(self, key: str, address: str, problem: str) -> None:
        self.key = key
        self.address = address
        super().__init__(
            f"{key} = {address!r}: cannot listen: {problem}; stop what holds the port "
            f"or set another {key}"
        )


_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
}


MAX_NAME = 256


def overlong(**fields: str) -> str:
    """'' when every name is short enough; else a message naming the first long one.

    Refusals quote the names a client sent; a huge name would not fit in the status.
    """
    for field, value in fields.items():
        if len(value) > MAX_NAME:
            return f"{field} is {len(value)} characters long; at most {MAX_NAME}"
    return ""


def is_transient(code: grpc.StatusCode | None) -> bool:
    return code in _TRANSIENT


def describe_rpc_error(e: grpc.RpcError) -> str:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    name = code.name if code is not None else "UNKNOWN"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{name}: cannot reach the server ({details})"
    return f"{name}: {details}"
