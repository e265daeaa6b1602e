"""A channel whose every call carries the bearer token (``x-txrepl-token``).

Private to :func:`common.security.client_channel`, the one client builder: callers
never build call metadata themselves, so a client cannot forget the token on one
call, or send it on a channel it was not meant for.
"""

from __future__ import annotations

import collections
from typing import Any

import grpc

__all__ = ["TOKEN_METADATA", "with_token"]

TOKEN_METADATA = "x-txrepl-token"


def with_token(channel: grpc.Channel, token: str) -> grpc.Channel:
    """``channel`` with ``token`` added to the metadata of every call."""
    return grpc.intercept_channel(channel, _TokenInterceptor(token))


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    """The details of a call, with the token added to its metadata."""


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Sends ``token`` as :data:`TOKEN_METADATA` with every call of the channel."""

    def __init__(self, token: str) -> None:
        self._pair = (TOKEN_METADATA, token)

    def _with_token(self, details: Any) -> _CallDetails:
        metadata = [*(details.metadata or ()), self._pair]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)
