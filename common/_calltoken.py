"""A channel whose every call carries the bearer token (``x-txrepl-token``).

Private to :func:`common.security.client_channel`, the one client builder, and its
asyncio twin ``aio_channel_factory`` (the subscriber daemon's Sync): callers never
build call metadata themselves, so a client cannot forget the token on one
call, or send it on a channel it was not meant for.
"""

from __future__ import annotations

import collections
from typing import Any

import grpc

__all__ = ["TOKEN_METADATA", "aio_token_interceptors", "with_token"]

TOKEN_METADATA = "x-txrepl-token"


def with_token(channel: grpc.Channel, token: str) -> grpc.Channel:
    """``channel`` with ``token`` added to the metadata of every call."""
    return grpc.intercept_channel(channel, _TokenInterceptor(token))


def aio_token_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors of an asyncio channel whose every call carries ``token``."""
    if not token:
        return []
    kinds = (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)
    return [kind(token) for kind in kinds]


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


class _AioToken:
    """The asyncio twin of :class:`_TokenInterceptor`; one subclass per call shape,
    because a grpc.aio channel files each interceptor under its FIRST matching kind."""

    def __init__(self, token: str) -> None:
        self._pair = (TOKEN_METADATA, token)

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(details.metadata) if details.metadata else ()))
        metadata.add(*self._pair)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _AioUnaryUnary(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _AioUnaryStream(_AioToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _AioStreamUnary(_AioToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._with_token(details), requests)


class _AioStreamStream(_AioToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._with_token(details), requests)
