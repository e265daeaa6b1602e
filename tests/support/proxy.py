"""A TCP fault proxy on loopback for chaos tests: forwards bytes and breaks them on demand.

It runs its own asyncio loop in a thread, so synchronous tests drive it directly::

    proxy = FaultProxy("127.0.0.1:7400").start()
    ... point the subscriber at proxy.address ...
    proxy.drop()           # close every connection (FIN both ways)
    proxy.reset()          # abort every connection (RST: SO_LINGER 0)
    proxy.stall(3.0)       # stop forwarding for 3 s, connections stay open
    proxy.refuse(True)     # close new connections at once until refuse(False)
    proxy.stop()

Every fault is counted in ``proxy.faults`` so a test can print what it injected.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["FaultProxy"]


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FaultProxy:
    def __init__(self, upstream: str, listen_host: str = "127.0.0.1") -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listen_host = listen_host
        self.address = ""
        self.faults: Counter[str] = Counter()
        self.accepted = 0
        self.bytes = 0
        self._conns: set[_Conn] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._refusing = False

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._start())
        return self

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, self.listen_host, 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"{self.listen_host}:{port}"

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all(rst=False)
        if self._server is not None:
            await self._server.wait_closed()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- faults -------------------------------------------------------------------------

    @property
    def connections(self) -> int:
        return len(self._conns)

    def drop(self) -> int:
        """Close every open connection (orderly FIN); returns how many."""
        self.faults["drop"] += 1
        return self._call(self._close_all(rst=False))

    def reset(self) -> int:
        """Abort every open connection with a TCP RST; returns how many."""
        self.faults["reset"] += 1
        return self._call(self._close_all(rst=True))

    def stall(self, seconds: float) -> None:
        """Stop forwarding in both directions for ``seconds`` (returns at once)."""
        self.faults["stall"] += 1
        self._loop.call_soon_threadsafe(self._stall, seconds)

    def refuse(self, on: bool) -> None:
        """While on, new connections are accepted and closed at once."""
        if on:
            self.faults["refuse"] += 1
        self._refusing = on

    def _stall(self, seconds: float) -> None:
        assert self._flowing is not None
        self._flowing.clear()
        self._loop.call_later(seconds, self._flowing.set)

    async def _close_all(self, rst: bool) -> int:
        conns = list(self._conns)
        for c in conns:
            for w in (c.client, c.upstream):
                sock = w.get_extra_info("socket")
                if rst and sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                w.close()
            for t in c.tasks:
                t.cancel()
        for c in conns:
            for t in c.tasks:
                with contextlib.suppress(BaseException):
                    await t
            self._conns.discard(c)
        return len(conns)

    # -- forwarding ---------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._refusing:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        conn = _Conn(writer, up_writer)
        self._conns.add(conn)
        conn.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, conn)),
            asyncio.create_task(self._pump(up_reader, writer, conn)),
        ]

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn
    ) -> None:
        assert self._flowing is not None
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
                self.bytes += len(data)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side ended: end the other too (no half-open connections).
            for w in (conn.client, conn.upstream):
                w.close()
            self._conns.discard(conn)
