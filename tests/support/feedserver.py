"""A publication's feeds served in process: a log, a registry, FeedManager behind gRPC.

For tests and benchmarks that drive a real feed with :class:`RawSubscriber`
(``tests/support/feedclient.py``) without starting a publisher daemon.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from common.client import schema_op
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.serve import GrpcEndpoint
from publisher.config import PublicationConfig
from publisher.feed import FeedManager
from publisher.log import open_log
from publisher.publication import Publication
from publisher.registry import Registry
from publisher.service import ReplicationService

__all__ = ["ServedFeeds", "served_feeds"]

R = TypeVar("R", bound=Registry)


@dataclass
class ServedFeeds(Generic[R]):
    pub: Publication  # "shop", its log holding the schema of table "notes" (id, body)
    registry: R
    feeds: FeedManager
    address: str


@contextlib.asynccontextmanager
async def served_feeds(
    root: Path,
    registry: type[R],
    schemas: Sequence[pb.TableSchema] = (),
    *,
    heartbeat_s: float = 5.0,
    queue_threshold: int = 10_000,
) -> AsyncIterator[ServedFeeds[R]]:
    """Publication "shop" (log and registry under ``root``) served on 127.0.0.1:0;
    its tables ``schemas`` (default: "notes"), their schema the log's first entry."""
    ops = [pb.Op(schema=s) for s in schemas] or [
        schema_op("notes", [("id", "integer"), ("body", "text")], ["id"])
    ]
    tables = [op.schema.table for op in ops]
    config = PublicationConfig(
        name="shop", tables=tables, heartbeat_s=heartbeat_s, queue_threshold=queue_threshold
    )
    pub = Publication(config, open_log(root / "log"))
    pub.append(pb.Entry(ops=ops))
    reg = registry(f"sqlite:///{root / 'registry.db'}")
    feeds = FeedManager("pub1", {"shop": pub}, reg)
    service = ReplicationService(feeds, {"shop": pub})
    endpoint = GrpcEndpoint(
        "127.0.0.1:0",
        [lambda s: rpc.add_ReplicationServicer_to_server(service, s)],
        ["txrepl.v1.Replication"],
    )
    await endpoint.start()
    try:
        yield ServedFeeds(pub, reg, feeds, endpoint.address)
    finally:
        feeds.stopping.set()
        await endpoint.stop(1.0)
        reg.close()
        pub.log.close()
