"""What both daemons share to serve gRPC: server start, health, reflection, signals.

Shutdown order (both daemons): health NOT_SERVING first, STOPPING=1 to systemd,
then the daemon drains its own work, then the server stops with a grace period.
A second SIGTERM/SIGINT during the drain forces exit (status 1).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.config import parse_address
from common.errors import ListenError

__all__ = [
    "GrpcEndpoint",
    "Malformed",
    "check_can_listen",
    "freeze_imports",
    "freeze_settled_heap",
    "freeze_startup_heap",
    "install_signal_handlers",
    "write_atomic",
]

log = structlog.get_logger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class GrpcEndpoint:
    """A grpc.aio server with health checking and reflection, bound to ``listen``."""

    def __init__(
        self,
        listen: str,
        register: Iterable[Callable[[grpc.aio.Server], None]],
        service_names: Iterable[str],
        *,
        credentials: grpc.ServerCredentials | None = None,
        interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
        key: str = "listen",
    ) -> None:
        self.listen = listen
        self.server = grpc.aio.server(
            # Malformed requests first: they get INVALID_ARGUMENT before anything else runs.
            interceptors=[MalformedRequestInterceptor(), *interceptors],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ],
        )
        for add in register:
            add(self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.names = list(service_names)
        reflection.enable_server_reflection(
            [
                *self.names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self.server,
        )
        self.components: set[str] = set()
        host, port = parse_address(listen, field=key)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if credentials is not None:
                self.port = self.server.add_secure_port(target, credentials)
            else:
                self.port = self.server.add_insecure_port(target)
        except RuntimeError:  # grpc: "Failed to bind to address ..."
            self.port = 0
        if self.port == 0:
            raise ListenError(key, listen, "address in use or not available")
        self.host = host

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for name in ["", *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def set_health(self, name: str, serving: bool) -> None:
        """Set one health service (a component's, or ``""`` for the whole daemon)."""
        if name not in self.names:
            self.components.add(name)
        status = health_pb2.HealthCheckResponse
        await self.health.set(name, status.SERVING if serving else status.NOT_SERVING)

    async def not_serving(self) -> None:
        for name in ["", *self.names, *sorted(self.components)]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        await self.server.stop(grace)


class Malformed:
    """Stands in for a request message that did not parse."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _safe(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as e:  # protobuf DecodeError and friends
            return Malformed(e)

    return parse


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], bad: Malformed) -> None:
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, f"malformed request message: {bad.error}"[:1000]
    )


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """Requests that do not parse end with INVALID_ARGUMENT naming the problem.

    Without this, grpc answers UNKNOWN "Unexpected <class DecodeError>", which tells a
    client nothing it can act on.
    """

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        parse = _safe(handler.request_deserializer)
        ser = handler.response_serializer
        if handler.unary_unary is not None:
            inner_uu: Any = handler.unary_unary

            async def uu(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, Malformed):
                    await _refuse(context, request)
                return await inner_uu(request, context)

            return grpc.unary_unary_rpc_method_handler(uu, parse, ser)
        if handler.unary_stream is not None:
            inner_us: Any = handler.unary_stream
            if not inspect.isasyncgenfunction(inner_us):
                return handler  # written with context.write: leave it as it is

            async def us(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, Malformed):
                    await _refuse(context, request)
                async for item in inner_us(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(us, parse, ser)
        if handler.stream_stream is not None:
            # Streams keep their behaviour: wrapping a long-lived stream handler races
            # with its own abort.  The handler sees Malformed items and refuses them
            # itself (publisher/feed.py).
            return grpc.stream_stream_rpc_method_handler(handler.stream_stream, parse, ser)
        return handler


def check_can_listen(key: str, listen: str) -> None:
    """Raise ListenError when ``listen`` cannot be bound now (port 0 always can).

    Run before a daemon touches anything (capture install, Spark), so a busy port
    ends in one line and changes nothing; the bind itself reports the rare race.
    """
    if not listen:
        return
    host, port = parse_address(listen, field=key)
    if port == 0:
        return
    try:
        # SO_REUSEADDR (set by create_server, as grpc and http.server set it): a port
        # in TIME_WAIT is free; one another process listens on is not.
        bare = host.strip("[]")
        family = socket.AF_INET6 if ":" in bare else socket.AF_INET
        with socket.create_server((bare, port), family=family):
            pass
    except OSError as e:
        problem = os.strerror(e.errno) if e.errno else str(e)
        raise ListenError(key, listen, problem.lower()) from None


def install_signal_handlers(stop: asyncio.Event) -> None:
    """First SIGTERM/SIGINT sets ``stop``; a second one forces exit."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second signal: forcing exit", signal=signal.Signals(signum).name)
            os._exit(1)
        log.info("signal received: draining", signal=signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


def freeze_imports() -> None:
    """Move the modules imported so far out of the GC, before the daemon's start-up.

    A daemon's start allocates enough to trigger full collections, and each walked
    every object of the modules just imported: two of 25-45 ms in a publisher started
    on a W1 backlog (its capture thread allocating meanwhile), one or two in a
    subscriber, on the path to its first batch.  No collection is run first: what the
    imports left as garbage is negligible and stays. :func:`freeze_startup_heap`
    then freezes what the start-up allocated.
    """
    gc.freeze()


def freeze_startup_heap() -> None:
    """Move what start-up allocated (modules, Spark and gRPC objects) out of the GC.

    Python's full collections walk every tracked object; after start-up most of them
    live for the whole run.  ``gc.freeze()`` leaves them out of later collections, so
    a full collection no longer stalls an in-sync apply or a feed for 40-90 ms
    (measured in the subscriber during W1's lag phase).
    """
    gc.collect()
    gc.freeze()


_settled = False


def freeze_settled_heap() -> None:
    """Once per process: collect, then freeze what is alive when the work has settled.

    Some start-up comes after READY: a subscriber's Spark session, its target's driver
    (imported on first use, subscriber/targets/__init__.py), schema and statement
    caches, the catch-up's last batch.  Left in the GC's oldest generation, they were
    walked by every full collection: 13-19 ms stalls of the in-sync apply, about two
    per 25 s of W1's lag phase, each one a late transaction in the p99.  The
    subscriber calls this when a subscription first reaches in sync; later calls do
    nothing, so objects that become garbage afterwards are collected as usual and
    only what was alive here (and the collection kept) is pinned, once.
    """
    global _settled
    if _settled:
        return
    _settled = True
    freeze_startup_heap()  # the same collect-then-freeze, once more


def write_atomic(path: Path, text: str) -> None:
    """tmp → fsync → rename → fsync dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
