"""A raw Sync client for tests: speaks the wire contract directly over real gRPC.

It applies what it receives to a :class:`ReferenceTarget`, acks (or not, or
stops reading) as the test asks, and records the status the stream ended with.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import grpc

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from tests.support.reference import ReferenceTarget


@dataclass
class RawSubscriber:
    address: str
    name: str
    publication: str = "shop"
    publisher: str = "pub1"
    level: int = 0
    incarnation: str = ""
    ack: bool = True
    read: bool = True
    token: str = ""  # sent as the x-txrepl-token metadata when set
    target: ReferenceTarget = field(default_factory=ReferenceTarget)
    welcome: pb.Welcome | None = None
    in_sync: asyncio.Event = field(default_factory=asyncio.Event)
    acked: asyncio.Event = field(default_factory=asyncio.Event)  # set after each batch's ack
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    code: grpc.StatusCode | None = None
    details: str = ""
    trailing: tuple[tuple[str, str | bytes], ...] = ()  # the status's trailing metadata
    batches: int = 0
    heartbeats: list[int] = field(default_factory=list)  # the head of each Heartbeat
    received: list[bytes] = field(default_factory=list)  # every entry's bytes, as sent
    _task: asyncio.Task[None] | None = None
    _channel: grpc.aio.Channel | None = None

    def hello(self) -> pb.SubscriberMessage:
        m = pb.SubscriberMessage()
        m.hello.subscriber = self.name
        m.hello.publisher = self.publisher
        m.hello.publication = self.publication
        m.hello.incarnation = self.incarnation
        m.hello.level = self.level
        return m

    async def start(self, first: pb.SubscriberMessage | None = None) -> RawSubscriber:
        self.target.level = self.level
        self._channel = grpc.aio.insecure_channel(self.address)
        stub = rpc.ReplicationStub(self._channel)
        self._call = stub.Sync(metadata=(("x-txrepl-token", self.token),) if self.token else None)
        await self._call.write(first if first is not None else self.hello())
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        try:
            while True:
                if not self.read:
                    await asyncio.sleep(0.05)
                    continue
                msg = await self._call.read()
                if msg is grpc.aio.EOF:
                    break
                assert isinstance(msg, pb.PublisherMessage)
                kind = msg.WhichOneof("kind")
                if kind == "welcome":
                    self.welcome = msg.welcome
                    self.incarnation = msg.welcome.incarnation
                elif kind == "batch":
                    self.batches += 1
                    self.received.extend(msg.batch.entries)
                    entries = [pb.Entry.FromString(e) for e in msg.batch.entries]
                    self.target.apply_all(msg.batch.first_seq, entries)
                    self.level = self.target.level
                    if self.ack:
                        a = pb.SubscriberMessage()
                        a.ack.level = self.level
                        await self._call.write(a)
                    self.acked.set()
                elif kind == "in_sync":
                    self.in_sync.set()
                elif kind == "heartbeat":
                    self.heartbeats.append(msg.heartbeat.head)
        except grpc.aio.AioRpcError:
            pass
        except asyncio.CancelledError:
            return
        except Exception as e:  # a broken stream or a failed apply: the test must see it
            self.details = f"client error: {type(e).__name__}: {e}"
            self._call.cancel()
            self.ended.set()
            raise
        finally:
            with contextlib.suppress(Exception):
                self.code = await self._call.code()
                self.details = await self._call.details() or ""
                self.trailing = tuple(await self._call.trailing_metadata() or ())
            self.ended.set()

    async def wait_ended(self, timeout: float = 30) -> tuple[grpc.StatusCode | None, str]:
        await asyncio.wait_for(self.ended.wait(), timeout)
        return self.code, self.details

    async def wait_level(self, level: int, timeout: float = 30) -> None:
        async def reach() -> None:
            while self.level < level:
                if self.ended.is_set():
                    raise AssertionError(f"{self.name} ended: {self.code} {self.details}")
                await asyncio.sleep(0.02)

        await asyncio.wait_for(reach(), timeout)

    async def close(self) -> None:
        if self._task is not None:
            self._call.cancel()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._channel is not None:
            await self._channel.close()
