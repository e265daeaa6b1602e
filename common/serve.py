"""What both daemons share to serve gRPC: server start, health, reflection, signals.

Shutdown order (both daemons): health NOT_SERVING first, STOPPING=1 to systemd,
then the daemon drains its own work, then the server stops with a grace period.
A second SIGTERM/SIGINT during the drain forces exit (status 1).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.config import parse_address

__all__ = ["GrpcEndpoint", "install_signal_handlers", "write_atomic"]

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
    ) -> None:
        self.listen = listen
        self.server = grpc.aio.server(
            interceptors=list(interceptors),
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
        host, port = parse_address(listen, field="listen")
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if credentials is not None:
            self.port = self.server.add_secure_port(target, credentials)
        else:
            self.port = self.server.add_insecure_port(target)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}: address in use or not available")
        self.host = host

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for name in ["", *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def not_serving(self) -> None:
        for name in ["", *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        await self.server.stop(grace)


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
