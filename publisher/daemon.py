"""The publisher daemon: capture → logs → feeds, behind one gRPC port.

Start-up: open (or create) each publication's log, install capture on the
source for every published table and start the capture thread; then open the
registry, bind the port, write ``<data_dir>/publisher.addr`` (the bound address,
so port 0 works), start the metrics endpoint (``metrics.addr``), then tell
systemd READY: by then the port accepts connections and the logs are open.

Capture first (issue 23, start-up): capture needs only the logs and the source,
so it resumes before the serving side is loaded — the registry's SQLAlchemy
import (publisher.registry is imported there, never at module level: feed.py,
service.py and retention.py name it for type checking only), the gRPC server,
the metrics endpoint.  What the operator can get wrong is checked before capture
starts (the ports, TLS files, tokens: ``_main`` and :meth:`Publisher.open`); a
start that fails after it (the registry, a port taken meanwhile) halts capture
after the entry in progress and closes the logs, as a stop does — entries it
logged meanwhile are ordinary captured entries (docs/performance.md).

While healthy (capture alive) the watchdog is pinged at a third of
``WatchdogSec``.  The capture thread moves committed source transactions into
the logs; the gRPC server serves Sync, Publish and Admin.

Health (common/health.py): ``txrepl.capture.<publication>`` per publication and
the whole publisher (``""``) turn NOT_SERVING while capture fails in a loop
(publisher/capture/health.py) or its thread has died, and SERVING again when it
recovers; ``txrepl_capture_failures`` counts the failed attempts.

Shutdown (SIGTERM): health NOT_SERVING, STOPPING=1, stop capture after the
entry in progress, cut the feeds ("publisher shutting down"), stop the server,
close the logs.  A second signal forces exit.

Security (common.security): TLS from ``[tls]``; when any token is configured an
interceptor checks every call against ``publisher.service.AUTH_RULES`` (role, and
the publication a Publish or Snapshot names; a method without a rule is refused),
and the feed's ``authorize`` hook checks that a Sync's token belongs to the Hello's
subscriber and grants the publication — before anything is written to the registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from common import metrics
from common.daemon import serve_daemon
from common.health import HealthBoard, Reading, health_loop
from common.latency import StageLatency
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import (
    AuthInterceptor,
    Principal,
    TokenBook,
    grant_problem,
    server_credentials,
    token_from_metadata,
)
from common.serve import (
    GrpcEndpoint,
    check_can_listen,
    freeze_imports,
    install_signal_handlers,
)
from common.systemd import Notifier
from publisher.capture import Source, SourceOptions
from publisher.capture.dialects import open_source
from publisher.capture.thread import CaptureThread
from publisher.config import PublisherConfig
from publisher.errors import FeedRefused, RegistryError, TableRefused
from publisher.feed import FeedManager
from publisher.log import open_log
from publisher.node import claim_source_node
from publisher.publication import Publication
from publisher.querysnap import QuerySnapshots, check_queries
from publisher.reshape import check_shapes, pending_reshapes, snapshot_only_keys, start_reshapes
from publisher.retention import retention_loop
from publisher.service import AUTH_RULES, AdminService, ReplicationService, subscriber_info
from publisher.snapshot import SnapshotSource

if TYPE_CHECKING:  # imported by open_registry(), once capture runs (module docstring)
    from publisher.registry import MeteredRegistry

__all__ = ["Publisher", "run"]

log = structlog.get_logger(__name__)


SUBSCRIBER_STATES = ("disconnected", "syncing", "in_sync", "invalid")


class PublisherCollector:
    """Reads the publications, the registry and the live feeds at scrape time."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher

    def collect(self) -> Iterator[Any]:
        p = self.publisher
        info = metrics.gauge("txrepl_info")
        info.add_metric(["publisher", p.config.server_name], 1)
        yield info
        head = metrics.gauge("txrepl_publication_head")
        first = metrics.gauge("txrepl_publication_first_retained")
        size = metrics.gauge("txrepl_publication_log_bytes")
        last = metrics.gauge("txrepl_publication_last_commit_timestamp_seconds")
        for name, pub in sorted(p.publications.items()):
            head.add_metric([name], pub.log.head)
            first.add_metric([name], pub.log.first_seq)
            size.add_metric([name], pub.log.size_bytes)
            last.add_metric([name], pub.last_commit_time)
        yield from (head, first, size, last)
        captured = metrics.counter("txrepl_capture_entries")
        captured.add_metric([], p.capture_thread.entries if p.capture_thread else 0)
        yield captured
        yield from self._capture_health()
        yield from p.health.collect()
        yield from self._subscribers()
        yield from self._feeds()

    def _capture_health(self) -> Iterator[Any]:
        source = self.publisher.source
        if source is None:
            return
        failures = metrics.counter("txrepl_capture_failures")
        failures.add_metric([], source.health.failures)
        in_a_row = metrics.gauge("txrepl_capture_failures_in_a_row")
        in_a_row.add_metric([], source.health.in_a_row)
        waits = metrics.counter("txrepl_capture_lock_waits")
        waits.add_metric([], source.health.lock_waits)
        yield from (failures, in_a_row, waits)
        try:
            lag = source.slot_lag()
        except Exception as e:  # the source is down: the lag is unknown, not zero
            log.debug("slot lag unknown", error=str(e))
            return
        if lag is None:
            return
        slot, lag_bytes, lag_s = lag
        by_bytes = metrics.gauge("txrepl_pg_slot_lag_bytes")
        by_s = metrics.gauge("txrepl_pg_slot_lag_seconds")
        for name in sorted(self.publisher.publications):
            by_bytes.add_metric([name, slot], lag_bytes)
            by_s.add_metric([name, slot], lag_s)
        yield from (by_bytes, by_s)

    def _subscribers(self) -> Iterator[Any]:
        registry = self.publisher.registry
        if registry is None:
            return
        level = metrics.gauge("txrepl_subscriber_level")
        lag = metrics.gauge("txrepl_subscriber_lag_entries")
        lag_s = metrics.gauge("txrepl_subscriber_lag_seconds")
        valid = metrics.gauge("txrepl_subscriber_valid")
        state = metrics.gauge("txrepl_subscriber_state")
        cuts = metrics.counter("txrepl_subscriber_cuts")
        for row in registry.list_subscribers():
            labels = [row.publication, row.subscriber]
            info = subscriber_info(row, self.publisher.publications.get(row.publication))
            level.add_metric(labels, info.level)
            lag.add_metric(labels, info.lag_entries)
            lag_s.add_metric(labels, info.lag_seconds)
            valid.add_metric(labels, 1 if info.valid else 0)
            states = (*SUBSCRIBER_STATES, *(() if row.state in SUBSCRIBER_STATES else (row.state,)))
            for lbl, v in metrics.state_gauge(labels, row.state, states):
                state.add_metric(lbl, v)
            cuts.add_metric(labels, info.cuts)
        yield from (level, lag, lag_s, valid, state, cuts)
        by_reason = metrics.counter("txrepl_feed_cuts")
        if hasattr(registry, "cuts_by_reason"):
            for (pub, reason), n in sorted(registry.cuts_by_reason.items()):
                by_reason.add_metric([pub, reason], n)
        yield by_reason

    def _feeds(self) -> Iterator[Any]:
        queue = metrics.gauge("txrepl_feed_queue_entries")
        in_flight = metrics.gauge("txrepl_feed_in_flight_entries")
        count = metrics.gauge("txrepl_feeds")
        counts: dict[tuple[str, str], int] = {}
        feeds = self.publisher.feeds
        for feed in list(feeds.feeds) if feeds is not None else []:
            pub = feed.publication
            labels = [pub.name, feed.subscriber]
            queue.add_metric(labels, max(0, pub.log.head - feed.acked))
            in_flight.add_metric(labels, max(0, feed.last_sent - feed.acked))
            counts[(pub.name, feed.state)] = counts.get((pub.name, feed.state), 0) + 1
        for name in sorted(self.publisher.publications):
            for st in ("syncing", "in_sync"):
                count.add_metric([name, st], counts.get((name, st), 0))
        yield from (queue, in_flight, count)


def token_book(config: PublisherConfig) -> TokenBook:
    entries = [(h, Principal("admin", "admin")) for h in config.auth.admin_token_hashes]
    entries += [(h, Principal(n, "publisher", pubs)) for h, n, pubs in config.auth.publish_grants()]
    entries += [
        (s.token_hash, Principal(s.name, "subscriber", tuple(s.publications)))
        for s in config.subscriber
    ]
    return TokenBook(entries)


class SyncAuthorizer:
    """The feed's ``authorize`` hook: the token's subscriber and its grants."""

    def __init__(self, book: TokenBook) -> None:
        self.book = book

    def __call__(self, hello: pb.Hello, context: Any) -> None:
        token = token_from_metadata(context.invocation_metadata()) or hello.token
        principal = self.book.identify(token)
        if principal is None:
            raise FeedRefused(
                grpc.StatusCode.UNAUTHENTICATED,
                "unknown or missing token",
                kind=pb.REFUSAL_KIND_UNAUTHENTICATED,
            )
        problem = (
            grant_problem(principal, hello.publication, hello.subscriber)
            if principal.role == "subscriber"
            else f"this token is not subscriber {hello.subscriber!r}'s"
        )
        if problem:
            raise FeedRefused(
                grpc.StatusCode.PERMISSION_DENIED, problem, kind=pb.REFUSAL_KIND_PERMISSION_DENIED
            )


class Publisher:
    def __init__(self, config: PublisherConfig) -> None:
        self.config = config
        self.data_dir = config.data_path
        self.stop_event = asyncio.Event()
        self.notifier = Notifier()
        self.publications: dict[str, Publication] = {}
        self.registry: MeteredRegistry | None = None
        self.source: Source | None = None
        self.capture_thread: CaptureThread | None = None
        self.endpoint: GrpcEndpoint | None = None
        self.feeds: FeedManager | None = None
        self.snapshots: SnapshotSource | None = None
        self.metrics_server: metrics.MetricsServer | None = None
        self.health = HealthBoard()
        self.node = ""  # the source's node name (common/origin.py), known once open
        # Exported from the registry open_metrics makes (common/latency.py).
        self.stages = StageLatency("txrepl_publication_stage_seconds", "publication")
        self.query_snapshots: QuerySnapshots | None = None
        self.credentials: grpc.ServerCredentials | None = None  # from [tls], read by open()
        self.work_started = False  # serve_daemon called start_work (it undoes a failed start)
        self.reshapes: dict[str, Any] = {}  # changed shapings, read by open() (reshape.py)

    def open(self) -> None:
        cfg = self.config
        check_shapes(cfg)  # filters and column lists against the source: before any write
        check_queries(cfg)  # query snapshots prepared on the source (querysnap.py)
        self.query_snapshots = QuerySnapshots(cfg, self.publications, snapshot_only_keys(cfg))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A node that disagrees with the recorded one is refused before anything is made.
        claim_source_node(cfg.source_url, cfg.node, cfg.server_name, record=False)
        for pc in cfg.publication:
            plog = open_log(
                self.data_dir / "publications" / pc.name,
                fsync=cfg.log.fsync,
                fsync_interval_ms=cfg.log.fsync_interval_ms,
                segment_bytes=cfg.log.segment_bytes,
            )
            self.publications[pc.name] = pub = Publication(pc, plog)
            pub.measure(self.stages)
        options = SourceOptions(
            slot=cfg.slot_name,
            plugin=cfg.plugin,
            poll_interval_s=cfg.poll_interval_ms / 1000,
            max_entry_bytes=cfg.max_entry_bytes,
            snapshot_readers=cfg.snapshot_readers,
            snapshot_range_rows=cfg.snapshot_range_rows,
        )
        self.source = open_source(cfg.source_url, options)  # checked: clear errors
        self.node = claim_source_node(cfg.source_url, cfg.node, cfg.server_name)
        for pub in self.publications.values():
            pub.node = self.node  # the origin of the source's own changes (common/origin.py)
        for pub in self.publications.values():
            if not pub.config.snapshot_only:  # snapshot-only: no capture (querysnap.py)
                self._install(pub)
        self.credentials = server_credentials(cfg.tls, cfg.path)  # TLS files: before capture
        # whether a log is new (head 0) decides its shaping record: read before capture
        self.reshapes = pending_reshapes(list(self.publications.values()), self.data_dir)
        self._start_capture()
        try:
            self.open_registry()
        except BaseException:
            self.abandon()
            raise

    def open_registry(self) -> None:
        """The registry (SQLAlchemy, imported here: after capture started, module docstring)."""
        import sqlalchemy

        from publisher.registry import MeteredRegistry

        url = self.config.registry_url or f"sqlite:///{self.data_dir / 'registry.db'}"
        try:
            self.registry = MeteredRegistry(url)
        except sqlalchemy.exc.SQLAlchemyError as e:
            why = str(getattr(e, "orig", None) or e).splitlines()[0]
            raise RegistryError(
                f"the registry cannot be opened ({why}): check registry_url and the data directory"
            ) from None

    def _start_capture(self) -> None:
        if self.source is not None:
            captured = [p for p in self.publications.values() if not p.config.snapshot_only]
            self.capture_thread = CaptureThread(self.source, captured)
            self.capture_thread.start()

    def _halt_capture(self) -> None:
        """Stop capture after the entry in progress (blocking: the event loop's is drain)."""
        if self.capture_thread is not None:
            self.capture_thread.halt.set()
            self.capture_thread.join(10)

    def _install(self, pub: Publication) -> None:
        """Install ``pub``'s tables; a table the source refuses (TableRefused: no primary
        key, a type that cannot be carried) is left out, loudly, and the others served."""
        assert self.source is not None
        tables = list(pub.config.tables)
        while True:
            try:
                self.source.install(pub.name, pub.log.incarnation, tables)
                return
            except TableRefused as e:
                if e.table not in tables:
                    raise
                log.error(
                    "table refused; serving the others",
                    publication=pub.name,
                    table=e.table,
                    error=str(e),
                )
                tables.remove(e.table)

    async def serve(self, *, ready: asyncio.Event | None = None) -> None:
        assert self.registry is not None
        cfg = self.config
        book = token_book(cfg)
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if cfg.auth_enabled:
            interceptors.append(AuthInterceptor(book, AUTH_RULES))
        feeds = FeedManager(
            cfg.server_name,
            self.publications,
            self.registry,
            authorize=SyncAuthorizer(book) if cfg.auth_enabled else None,
        )
        self.feeds = feeds
        snapshots = (
            SnapshotSource(cfg.server_name, self.source, self.publications)
            if self.source is not None
            else None
        )
        replication = ReplicationService(feeds, self.publications, snapshots)
        admin = AdminService(
            cfg.server_name,
            self.publications,
            self.registry,
            live=self._live_feeds,
            capture=self.source.health if self.source is not None else None,
            query_snapshots=self.query_snapshots,
            node=self.node,
        )
        self.endpoint = GrpcEndpoint(
            cfg.listen,
            [
                lambda s: rpc.add_ReplicationServicer_to_server(replication, s),
                lambda s: rpc.add_AdminServicer_to_server(admin, s),
            ],
            ["txrepl.v1.Replication", "txrepl.v1.Admin"],
            credentials=self.credentials,
            interceptors=interceptors,
        )
        self.snapshots = snapshots
        await serve_daemon(
            self,
            name="publisher",
            endpoint=self.endpoint,
            data_dir=self.data_dir,
            metrics_listen=cfg.metrics_listen,
            ready_status=lambda address: f"serving on {address}",
            grace=3.0,
            log=log,
            ready=ready,
        )

    def start_work(self) -> None:
        """Capture runs already (open()); snapshots and reshapes start with the port."""
        self.work_started = True
        if self.source is not None:
            if self.snapshots is not None:
                self.snapshots.running = True
            # a changed filter or column list, carried out once capture runs (reshape.py)
            pubs = list(self.publications.values())
            start_reshapes(self.source, pubs, self.data_dir, self.reshapes)

    def open_metrics(self) -> Any:
        registry = metrics.new_registry()
        registry.register(PublisherCollector(self))
        self.stages.register(registry)
        return registry

    def ready_fields(self, address: str) -> dict[str, Any]:
        cfg = self.config
        return {
            "server": cfg.server_name,
            "node": self.node,
            "listen": address,
            "tls": cfg.tls.enabled,
            "mutual_tls": bool(cfg.tls.client_ca_file),
            "auth": cfg.auth_enabled,
            "publications": {n: p.log.head for n, p in self.publications.items()},
        }

    async def healthy(self) -> bool:
        return self.capture_thread is None or self.capture_thread.is_alive()

    def background(self) -> list[Coroutine[Any, Any, None]]:
        assert self.registry is not None
        assert self.endpoint is not None
        return [
            retention_loop(
                self.publications,
                self.registry,
                self.config.retention_interval_s,
                self._live_feeds,
            ),
            health_loop(self.endpoint, self._health, self.health),
            *([self.query_snapshots.loop()] if self.query_snapshots is not None else []),
        ]

    def _health(self) -> Reading:
        """Capture per publication (common/health.py): a publication whose capture
        refused a row is not serving alone; a failing source takes the whole publisher."""
        cap = self.source.health if self.source is not None else None
        alive = self.capture_thread is None or self.capture_thread.is_alive()
        ok = alive and (cap is None or cap.serving)
        why = "" if ok else (cap.last_error if cap is not None and alive else "capture stopped")
        names = {f"txrepl.capture.{n}": n for n in sorted(self.publications)}
        comps = {c: ok and (cap is None or cap.serving_for(n)) for c, n in names.items()}
        whys = {c: (cap.error_for(n) if ok and cap is not None else why) for c, n in names.items()}
        return ok, comps, {"": why, **whys}

    def _live_feeds(self) -> set[tuple[str, str]]:
        """(publication, subscriber) of every open feed; read on the event loop."""
        feeds = self.feeds.feeds if self.feeds is not None else set()
        return {(f.publication.name, f.subscriber) for f in feeds}

    async def drain(self) -> None:
        """Capture stops after the entry in progress, then the feeds are cut."""
        if self.capture_thread is not None:
            self.capture_thread.halt.set()
            await asyncio.to_thread(self.capture_thread.join, 10)
        if self.feeds is not None:
            self.feeds.stopping.set()

    def stopped_fields(self) -> dict[str, Any]:
        return {}

    def abandon(self) -> None:
        """A start that failed before serve_daemon took over (it undoes its own): stop
        the capture open() started and close, so nothing runs on while the process exits."""
        if not self.work_started:
            self._halt_capture()
            self.close()

    def close(self) -> None:
        for pub in self.publications.values():
            pub.log.close()
        if self.source is not None:
            self.source.release()
        if self.registry is not None:
            self.registry.close()


async def _main(config: PublisherConfig) -> None:
    check_can_listen("listen", config.listen)
    check_can_listen("metrics_listen", config.metrics_listen)
    publisher = Publisher(config)
    publisher.open()  # capture runs from here (module docstring)
    try:
        install_signal_handlers(publisher.stop_event)
        await publisher.serve()
    except BaseException:
        publisher.abandon()
        raise


def run(config: PublisherConfig) -> None:
    freeze_imports()
    asyncio.run(_main(config))


def default_addr_file(data_dir: Path) -> Path:
    return data_dir / "publisher.addr"
