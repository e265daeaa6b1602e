"""The subscriber's control service: status, pause, resume, reconnect now,
unbreak; and
:data:`AUTH_RULES`, who may call it once ``[auth] admin_token_hashes`` is set."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import grpc

from common.errors import MAX_NAME
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import Rule
from subscriber.apply import ApplyError
from subscriber.control_errors import errors_of, retry_in_daemon, skip_in_daemon
from subscriber.subscription import SubscriptionRunner

__all__ = ["AUTH_RULES", "ControlService"]

# Control acts on every subscription of this daemon: admin tokens only.  A method
# without a rule is refused (tests/unit/common/test_auth_rules.py).
AUTH_RULES: Mapping[str, Rule] = {"/txrepl.v1.SubscriberControl/": Rule(frozenset({"admin"}))}


class ControlService(rpc.SubscriberControlServicer):
    def __init__(
        self,
        server_name: str,
        runners: Mapping[str, SubscriptionRunner],
        loads: Callable[[str], pb.SnapshotLoad | None] | None = None,
    ) -> None:
        self.server_name = server_name
        self.runners = runners
        self.loads = loads  # a snapshot load under way, per subscription (reinit/progress.py)

    def _status(self, runner: SubscriptionRunner) -> pb.SubscriptionStatus:
        out = runner.status()
        load = self.loads(out.name) if self.loads is not None else None
        if load is not None:
            out.snapshot.CopyFrom(load)
        return out

    async def Status(
        self,
        request: pb.StatusRequest,
        context: grpc.aio.ServicerContext[pb.StatusRequest, pb.StatusResponse],
    ) -> pb.StatusResponse:
        out = pb.StatusResponse(subscriber=self.server_name)
        out.subscriptions.extend(self._status(r) for r in self.runners.values())
        return out

    async def _select(
        self,
        request: pb.SubscriptionRequest,
        context: grpc.aio.ServicerContext[pb.SubscriptionRequest, pb.SubscriptionResponse],
    ) -> list[SubscriptionRunner]:
        if not request.subscription:
            return list(self.runners.values())
        if len(request.subscription) > MAX_NAME:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "subscription name too long")
        runner = self.runners.get(request.subscription)
        if runner is None:
            known = ", ".join(sorted(self.runners)) or "none"
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no subscription {request.subscription!r} (known: {known})",
            )
        assert runner is not None
        return [runner]

    async def _each(
        self,
        request: pb.SubscriptionRequest,
        context: grpc.aio.ServicerContext[pb.SubscriptionRequest, pb.SubscriptionResponse],
        action: Callable[[SubscriptionRunner], None],
    ) -> pb.SubscriptionResponse:
        runners = await self._select(request, context)
        for r in runners:
            action(r)
        return pb.SubscriptionResponse(subscriptions=[self._status(r) for r in runners])

    async def Pause(
        self,
        request: pb.SubscriptionRequest,
        context: grpc.aio.ServicerContext[pb.SubscriptionRequest, pb.SubscriptionResponse],
    ) -> pb.SubscriptionResponse:
        return await self._each(request, context, SubscriptionRunner.pause)

    async def Resume(
        self,
        request: pb.SubscriptionRequest,
        context: grpc.aio.ServicerContext[pb.SubscriptionRequest, pb.SubscriptionResponse],
    ) -> pb.SubscriptionResponse:
        return await self._each(request, context, SubscriptionRunner.resume)

    async def Reconnect(
        self,
        request: pb.SubscriptionRequest,
        context: grpc.aio.ServicerContext[pb.SubscriptionRequest, pb.SubscriptionResponse],
    ) -> pb.SubscriptionResponse:
        return await self._each(request, context, SubscriptionRunner.reconnect)

    async def Unbreak(
        self,
        request: pb.SubscriptionRequest,
        context: grpc.aio.ServicerContext[pb.SubscriptionRequest, pb.SubscriptionResponse],
    ) -> pb.SubscriptionResponse:
        return await self._each(request, context, SubscriptionRunner.unbreak)

    async def ListErrors(
        self,
        request: pb.SubscriptionRequest,
        context: grpc.aio.ServicerContext[pb.SubscriptionRequest, pb.ErrorsResponse],
    ) -> pb.ErrorsResponse:
        runners = await self._select(request, context)  # type: ignore[arg-type]
        return await asyncio.to_thread(errors_of, runners)

    async def RetryError(
        self,
        request: pb.ErrorRequest,
        context: grpc.aio.ServicerContext[pb.ErrorRequest, pb.SubscriptionResponse],
    ) -> pb.SubscriptionResponse:
        return await self._on_error(request, context, retry_in_daemon)

    async def SkipError(
        self,
        request: pb.ErrorRequest,
        context: grpc.aio.ServicerContext[pb.ErrorRequest, pb.SubscriptionResponse],
    ) -> pb.SubscriptionResponse:
        return await self._on_error(request, context, skip_in_daemon)

    async def _on_error(
        self,
        request: pb.ErrorRequest,
        context: grpc.aio.ServicerContext[pb.ErrorRequest, pb.SubscriptionResponse],
        action: Callable[[SubscriptionRunner, int], None],
    ) -> pb.SubscriptionResponse:
        if not request.subscription:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name the subscription")
        select = pb.SubscriptionRequest(subscription=request.subscription)
        [runner] = await self._select(select, context)  # type: ignore[arg-type]
        try:
            await asyncio.to_thread(action, runner, request.seq)
        except ApplyError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.SubscriptionResponse(subscriptions=[self._status(runner)])
