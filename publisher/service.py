"""gRPC servicers of the publisher: Replication (Sync, Publish, Snapshot) and Admin,
and :data:`AUTH_RULES`, who may call each of them once any token is configured
(enforced by common.security.AuthInterceptor before a servicer runs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from common.errors import overlong
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import Rule
from publisher.capture.health import CaptureHealth
from publisher.errors import ShapeRefused, SourceError
from publisher.feed import FeedManager
from publisher.publication import Publication
from publisher.querysnap import QuerySnapshots
from publisher.snapshot import SnapshotSource

if TYPE_CHECKING:  # the registry imports SQLAlchemy: not before capture runs (daemon.py)
    from publisher.registry import Registry, SubscriberRow

__all__ = ["AUTH_RULES", "AdminService", "ReplicationService", "subscriber_info"]

log = structlog.get_logger(__name__)

MAX_PUBLISH_OPS = 100_000

# Every method of the services this file implements; a method without a rule is
# refused (tests/unit/common/test_auth_rules.py checks the table against the proto).
AUTH_RULES: Mapping[str, Rule] = {
    "/txrepl.v1.Admin/": Rule(frozenset({"admin"})),  # every publication: admin only
    "/txrepl.v1.Replication/Publish": Rule(
        frozenset({"admin", "publisher"}), publication="publication"
    ),
    # The Hello names subscriber and publication: the feed checks them (SyncAuthorizer).
    "/txrepl.v1.Replication/Sync": Rule(frozenset({"subscriber"}), in_stream=True),
    # Every row of every table of the publication: its subscriber, or an operator.
    "/txrepl.v1.Replication/Snapshot": Rule(
        frozenset({"admin", "subscriber"}), publication="publication", subscriber="subscriber"
    ),
}


class ReplicationService(rpc.ReplicationServicer):
    def __init__(
        self,
        feeds: FeedManager,
        publications: Mapping[str, Publication],
        snapshots: SnapshotSource | None = None,
    ) -> None:
        self.feeds = feeds
        self.publications = publications
        self.snapshots = snapshots

    async def Snapshot(
        self,
        request: pb.SnapshotRequest,
        context: grpc.aio.ServicerContext[pb.SnapshotRequest, pb.SnapshotChunk],
    ) -> AsyncIterator[pb.SnapshotChunk]:
        pub = await _publication(self.publications, request.publication, context)
        if pub.config.snapshot_only:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"publication {pub.name!r} is snapshot-only: each refresh reaches its "
                "subscribers through Sync (txrepl admin refresh-snapshot); no reinit needed",
            )
        if self.snapshots is None or not self.snapshots.ready:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "snapshots need a running capture (a SQLite or PostgreSQL source);"
                " this publisher has none running",
            )
        assert self.snapshots is not None
        log.info("snapshot requested", publication=pub.name, subscriber=request.subscriber)
        chunks = self.snapshots.stream(pub, request.chunk_rows, copy=request.accept_copy_text)
        try:
            while True:
                try:
                    chunk = await asyncio.to_thread(next, chunks, None)
                except SourceError as e:
                    log.error("snapshot failed", publication=pub.name, error=str(e))
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"snapshot failed: {e}")
                if chunk is None:
                    return
                yield chunk
        finally:
            await asyncio.to_thread(chunks.close)

    async def Sync(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[pb.SubscriberMessage],
        context: grpc.aio.ServicerContext[pb.SubscriberMessage, pb.PublisherMessage],
    ) -> None:
        await self.feeds.sync(request_iterator, context)

    async def Publish(
        self,
        request: pb.PublishRequest,
        context: grpc.aio.ServicerContext[pb.PublishRequest, pb.PublishResponse],
    ) -> pb.PublishResponse:
        pub = await _publication(self.publications, request.publication, context)
        if not request.ops:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Publish needs at least one op")
        if len(request.ops) > MAX_PUBLISH_OPS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Publish carries {len(request.ops)} ops; at most {MAX_PUBLISH_OPS} per call",
            )
        for i, op in enumerate(request.ops):
            problem = _check_op(op)
            if problem:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ops[{i}]: {problem}")
        entry = pb.Entry(ops=request.ops)
        try:
            seq = await asyncio.to_thread(pub.append, entry)
        except ShapeRefused as e:  # a shaped table's row without its schema: not written
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        log.info("entry published", publication=pub.name, seq=seq, ops=len(request.ops))
        return pb.PublishResponse(seq=seq)


async def _publication(
    publications: Mapping[str, Publication],
    name: str,
    context: grpc.aio.ServicerContext[Any, Any],
) -> Publication:
    """The publication called ``name``, or the call ends: INVALID_ARGUMENT / NOT_FOUND."""
    problem = overlong(publication=name)
    if problem:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
    pub = publications.get(name)
    if pub is None:
        known = ", ".join(sorted(publications)) or "none"
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"publication {name!r} not found (known: {known})"
        )
    assert pub is not None
    return pub


def _check_op(op: pb.Op) -> str:
    kind = op.WhichOneof("kind")
    if kind is None:
        return "empty op"
    if kind == "row":
        if not op.row.table:
            return "row change without a table"
        if op.row.op == pb.ROW_OP_UNSPECIFIED:
            return "row change without an operation"
        if op.row.op in (pb.ROW_OP_UPDATE, pb.ROW_OP_DELETE) and not op.row.key:
            return "update/delete without the key"
        if op.row.op in (pb.ROW_OP_INSERT, pb.ROW_OP_UPDATE) and not op.row.row:
            return "insert/update without the row"
    if kind == "schema":
        if not op.schema.table or not op.schema.columns:
            return "schema without a table or columns"
        names = {c.name for c in op.schema.columns}
        missing = [k for k in op.schema.primary_key if k not in names]
        if not op.schema.primary_key or missing:
            return "schema needs a primary key made of its columns"
    if kind == "sql" and not op.sql.sql.strip():
        return "empty SQL statement"
    if kind == "call" and not op.call.name:
        return "procedure call without a name"
    return ""


def subscriber_info(row: SubscriberRow, pub: Publication | None) -> pb.SubscriberInfo:
    head = pub.log.head if pub is not None else row.level
    lag = max(0, head - row.level)
    lag_s = 0.0
    if lag and pub is not None:
        # Time since the oldest entry the subscriber still lacks was committed.
        try:
            (payload,) = pub.log.read(row.level + 1, max_entries=1)
            lag_s = max(0.0, time.time() - pb.Entry.FromString(payload).commit_time_us / 1e6)
        except Exception:  # purged or unreadable: lag in entries still tells
            lag_s = 0.0
    return pb.SubscriberInfo(
        subscriber=row.subscriber,
        publication=row.publication,
        level=row.level,
        lag_entries=lag,
        lag_seconds=lag_s,
        state=row.state,
        valid=row.valid,
        cuts=row.cuts,
        last_cut_reason=row.last_cut_reason or row.invalid_reason,
        last_ack_us=int((row.last_ack or 0) * 1e6),
        connected_since_us=int((row.connected_since or 0) * 1e6),
    )


class AdminService(rpc.AdminServicer):
    def __init__(
        self,
        server_name: str,
        publications: Mapping[str, Publication],
        registry: Registry,
        live: Callable[[], Collection[tuple[str, str]]] = frozenset,
        capture: CaptureHealth | None = None,
        query_snapshots: QuerySnapshots | None = None,
        node: str = "",
    ) -> None:
        self.server_name = server_name
        self.node = node  # the source's node name (docs/topologies.md)
        self.query_snapshots = query_snapshots
        self.publications = publications
        self.registry = registry
        self.live = live  # (publication, subscriber) pairs with a feed open now
        self.capture = capture  # the source's capture health (every publication shares it)

    async def ListPublications(
        self,
        request: pb.ListPublicationsRequest,
        context: grpc.aio.ServicerContext[pb.ListPublicationsRequest, pb.ListPublicationsResponse],
    ) -> pb.ListPublicationsResponse:
        out = pb.ListPublicationsResponse(publisher=self.server_name, node=self.node)
        cap = self.capture
        for name, pub in sorted(self.publications.items()):
            info = out.publications.add(
                name=name,
                incarnation=pub.log.incarnation,
                head=pub.log.head,
                first_retained=pub.log.first_seq,
                log_bytes=pub.log.size_bytes,
                tables=pub.config.tables,
            )
            if cap is not None:
                info.capture_failing = not cap.serving_for(name)
                info.capture_failures = cap.failures
                info.capture_error = cap.error_for(name)
        return out

    async def ListSubscribers(
        self,
        request: pb.ListSubscribersRequest,
        context: grpc.aio.ServicerContext[pb.ListSubscribersRequest, pb.ListSubscribersResponse],
    ) -> pb.ListSubscribersResponse:
        problem = overlong(publication=request.publication)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if request.publication and request.publication not in self.publications:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"publication {request.publication!r} not found"
            )
        rows = await asyncio.to_thread(self.registry.list_subscribers, request.publication or None)
        out = pb.ListSubscribersResponse()
        for row in rows:
            out.subscribers.append(subscriber_info(row, self.publications.get(row.publication)))
        return out

    async def _row(
        self, publication: str, subscriber: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[Publication, SubscriberRow]:
        """The publication and the registry row an operator names, or the call ends
        with INVALID_ARGUMENT / NOT_FOUND naming what is known."""
        problem = overlong(publication=publication, subscriber=subscriber)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        pub = await _publication(self.publications, publication, context)
        row = await asyncio.to_thread(self.registry.get, publication, subscriber)
        if row is None:
            rows = await asyncio.to_thread(self.registry.list_subscribers, publication)
            known = ", ".join(r.subscriber for r in rows) or "none"
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"subscriber {subscriber!r} has never synced {publication!r} "
                f"(subscribers of {publication!r}: {known})",
            )
        assert row is not None
        return pub, row

    async def _not_live(
        self, row: SubscriberRow, action: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """End the call (FAILED_PRECONDITION) when ``row``'s subscriber has a live feed."""
        if (row.publication, row.subscriber) in self.live():
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"subscriber {row.subscriber!r} is connected to {row.publication!r} now "
                f"(state {row.state}): stop it or pause its subscription, then {action} it",
            )

    async def MarkValid(
        self,
        request: pb.MarkValidRequest,
        context: grpc.aio.ServicerContext[pb.MarkValidRequest, pb.MarkValidResponse],
    ) -> pb.MarkValidResponse:
        pub, _ = await self._row(request.publication, request.subscriber, context)
        if request.level and request.level > pub.log.head:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"level {request.level} is beyond the head {pub.log.head}",
            )
        await asyncio.to_thread(
            self.registry.mark_valid,
            request.publication,
            request.subscriber,
            request.level or None,
        )
        log.warning(
            "subscriber marked valid by an operator",
            publication=request.publication,
            subscriber=request.subscriber,
        )
        row = await asyncio.to_thread(self.registry.get, request.publication, request.subscriber)
        assert row is not None
        return pb.MarkValidResponse(subscriber=subscriber_info(row, pub))

    async def DropSubscriber(
        self,
        request: pb.DropSubscriberRequest,
        context: grpc.aio.ServicerContext[pb.DropSubscriberRequest, pb.DropSubscriberResponse],
    ) -> pb.DropSubscriberResponse:
        pub, row = await self._row(request.publication, request.subscriber, context)
        await self._not_live(row, "drop", context)
        dropped = await asyncio.to_thread(self.registry.drop, pub.name, row.subscriber)
        if dropped is None:  # dropped by a concurrent call meanwhile: report the row we saw
            dropped = row
        log.warning(
            "subscriber dropped by an operator",
            publication=pub.name,
            subscriber=row.subscriber,
            sync_level=dropped.level,
            head=pub.log.head,
        )
        return pb.DropSubscriberResponse(subscriber=subscriber_info(dropped, pub))

    async def RefreshSnapshot(
        self,
        request: pb.RefreshSnapshotRequest,
        context: grpc.aio.ServicerContext[pb.RefreshSnapshotRequest, pb.RefreshSnapshotResponse],
    ) -> pb.RefreshSnapshotResponse:
        """Virtuoso's UPDATE SNAPSHOT: evaluate the query now (publisher/querysnap.py)."""
        snaps = await self._snapshots(request.publication, request.table, context)
        try:
            rows = await asyncio.to_thread(snaps.refresh_now, request.publication, request.table)
        except LookupError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except Exception as e:  # the source refused the query: say so, nothing appended
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"refresh failed: {e}")
        head = self.publications[request.publication].log.head
        return pb.RefreshSnapshotResponse(rows=rows, head=head)

    async def DropSnapshot(
        self,
        request: pb.DropSnapshotRequest,
        context: grpc.aio.ServicerContext[pb.DropSnapshotRequest, pb.DropSnapshotResponse],
    ) -> pb.DropSnapshotResponse:
        """Virtuoso's DROP SNAPSHOT [WITH DELETE]: no more refreshes (and the table dropped)."""
        snaps = await self._snapshots(request.publication, request.table, context)
        try:
            await asyncio.to_thread(
                snaps.drop, request.publication, request.table, with_delete=request.with_delete
            )
        except LookupError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return pb.DropSnapshotResponse(head=self.publications[request.publication].log.head)

    async def _snapshots(
        self, publication: str, table: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> QuerySnapshots:
        problem = overlong(publication=publication, table=table)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await _publication(self.publications, publication, context)
        if self.query_snapshots is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no query snapshots here")
        assert self.query_snapshots is not None
        return self.query_snapshots

    async def InvalidateSubscriber(
        self,
        request: pb.InvalidateSubscriberRequest,
        context: grpc.aio.ServicerContext[
            pb.InvalidateSubscriberRequest, pb.InvalidateSubscriberResponse
        ],
    ) -> pb.InvalidateSubscriberResponse:
        pub, row = await self._row(request.publication, request.subscriber, context)
        await self._not_live(row, "invalidate", context)
        problem = overlong(reason=request.reason)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        reason = "invalidated by an operator" + (f": {request.reason}" if request.reason else "")
        await asyncio.to_thread(self.registry.mark_invalid, pub.name, row.subscriber, reason)
        log.warning(
            "subscriber invalidated by an operator",
            publication=pub.name,
            subscriber=row.subscriber,
            sync_level=row.level,
            reason=reason,
        )
        after = await asyncio.to_thread(self.registry.get, pub.name, row.subscriber)
        return pb.InvalidateSubscriberResponse(subscriber=subscriber_info(after or row, pub))
