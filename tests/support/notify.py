"""A stand-in for systemd's notify socket, and a gRPC health probe."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.security import ClientTls, client_channel


class NotifySocket:
    """A unix datagram socket standing in for systemd; records what arrives, and when."""

    def __init__(self, path: Path, on_ready: Any = None) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self.on_ready = on_ready
        self.ready_check: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            except OSError:
                return
            if data.startswith("READY=1") and self.on_ready is not None:
                # Checked at the moment READY arrives, before anything else happens.
                self.ready_check = self.on_ready()
            self.messages.append((time.monotonic(), data))

    def states(self) -> list[str]:
        return [m.split("\n")[0] for _, m in self.messages]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def health(address: str, tls: ClientTls | None = None, service: str = "") -> str:
    with client_channel(address, tls) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=3
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
