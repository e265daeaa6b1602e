"""The publisher daemon: capture → logs → feeds, behind one gRPC port.

Start-up: open (or create) each publication's log, the registry, install
capture on the source for every published table, bind the port, write
``<data_dir>/publisher.addr`` (the bound address, so port 0 works), then tell
systemd READY.  The capture thread moves committed source transactions into the
logs; the gRPC server serves Sync, Publish and Admin.

Shutdown (SIGTERM): health NOT_SERVING, STOPPING=1, stop capture after the
entry in progress, cut the feeds ("publisher shutting down"), stop the server,
close the logs.  A second signal forces exit.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import structlog

from common.rpc import txrepl_pb2_grpc as rpc
from common.serve import GrpcEndpoint, install_signal_handlers, write_atomic
from common.systemd import Notifier
from publisher.capture import SqliteCapture
from publisher.config import PublisherConfig
from publisher.errors import SourceError
from publisher.feed import FeedManager
from publisher.log import open_log
from publisher.publication import Publication
from publisher.registry import Registry
from publisher.service import AdminService, ReplicationService

__all__ = ["Publisher", "run"]

log = structlog.get_logger(__name__)


class CaptureThread(threading.Thread):
    """Moves captured source rows into the publication logs, in commit order."""

    def __init__(
        self, capture: SqliteCapture, pubs: list[Publication], poll_interval_s: float
    ) -> None:
        super().__init__(name="txrepl-capture", daemon=True)
        self.capture = capture
        self.pubs = pubs
        self.poll_interval_s = poll_interval_s
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.entries = 0

    def run(self) -> None:
        failures = 0
        force = True
        while not self.halt.is_set():
            try:
                if self.capture.changed() or force:
                    force = False
                    self.step()
                failures = 0
            except Exception as e:  # keep capturing; the source may be busy or briefly locked
                failures += 1
                force = True
                log.error("capture failed; retrying", error=str(e), failures=failures)
                self.halt.wait(min(5.0, 0.1 * 2**failures))
                continue
            self.halt.wait(self.poll_interval_s)

    def step(self) -> int:
        """One poll: every committed capture row becomes at most one entry per publication."""
        low = min(p.position for p in self.pubs)
        rows = self.capture.read(low)
        if not rows:
            return 0
        installed = self.capture.installed()
        appended = 0
        for pub in self.pubs:
            entry, last = self.capture.build_entry(
                pub.name, rows, pub.position, installed.get(pub.name, {})
            )
            if entry is not None:
                pub.append(entry, position=last)
                appended += 1
            elif last > pub.position:
                pub.advance(last)
        self.capture.release(min(p.position for p in self.pubs))
        self.entries += appended
        return appended


class Publisher:
    def __init__(self, config: PublisherConfig) -> None:
        self.config = config
        self.data_dir = config.data_path
        self.stop_event = asyncio.Event()
        self.notifier = Notifier()
        self.publications: dict[str, Publication] = {}
        self.registry: Registry | None = None
        self.capture: SqliteCapture | None = None
        self.capture_thread: CaptureThread | None = None
        self.endpoint: GrpcEndpoint | None = None

    def open(self) -> None:
        cfg = self.config
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for pc in cfg.publication:
            plog = open_log(
                self.data_dir / "publications" / pc.name,
                fsync=cfg.log.fsync,
                fsync_interval_ms=cfg.log.fsync_interval_ms,
                segment_bytes=cfg.log.segment_bytes,
            )
            self.publications[pc.name] = Publication(pc, plog)
        self.registry = Registry(f"sqlite:///{self.data_dir / 'registry.db'}")
        if cfg.source.startswith("sqlite:///"):
            self.capture = SqliteCapture(cfg.sqlite_source_path)
            for pub in self.publications.values():
                self.capture.install(pub.name, pub.log.incarnation, pub.config.tables)
        else:
            raise SourceError(
                f"source {cfg.source!r}: PostgreSQL capture is not available in this build"
            )

    async def serve(self, *, ready: asyncio.Event | None = None) -> None:
        assert self.registry is not None
        cfg = self.config
        feeds = FeedManager(cfg.server_name, self.publications, self.registry)
        replication = ReplicationService(feeds, self.publications)
        admin = AdminService(cfg.server_name, self.publications, self.registry)
        self.endpoint = GrpcEndpoint(
            cfg.listen,
            [
                lambda s: rpc.add_ReplicationServicer_to_server(replication, s),
                lambda s: rpc.add_AdminServicer_to_server(admin, s),
            ],
            ["txrepl.v1.Replication", "txrepl.v1.Admin"],
        )
        await self.endpoint.start()
        if self.capture is not None:
            pubs = list(self.publications.values())
            self.capture_thread = CaptureThread(self.capture, pubs, cfg.poll_interval_ms / 1000)
            self.capture_thread.start()
        write_atomic(self.data_dir / "publisher.addr", self.endpoint.address + "\n")
        log.info(
            "publisher ready",
            server=cfg.server_name,
            listen=self.endpoint.address,
            publications={n: p.log.head for n, p in self.publications.items()},
        )
        self.notifier.ready(f"serving on {self.endpoint.address}")
        if ready is not None:
            ready.set()
        watchdog = asyncio.create_task(self._watchdog())
        try:
            await self.stop_event.wait()
        finally:
            watchdog.cancel()
            log.info("publisher stopping")
            await self.endpoint.not_serving()
            self.notifier.stopping()
            if self.capture_thread is not None:
                self.capture_thread.halt.set()
                await asyncio.to_thread(self.capture_thread.join, 10)
            feeds.stopping.set()
            await self.endpoint.stop(grace=3.0)
            self.close()
            log.info("publisher stopped")

    async def _watchdog(self) -> None:
        if not self.notifier.watchdog_s:
            return
        while True:
            healthy = self.capture_thread is None or self.capture_thread.is_alive()
            if healthy:
                self.notifier.watchdog()
            await asyncio.sleep(self.notifier.watchdog_s / 3)

    def close(self) -> None:
        for pub in self.publications.values():
            pub.log.close()
        if self.capture is not None:
            self.capture.close()
        if self.registry is not None:
            self.registry.close()


async def _main(config: PublisherConfig) -> None:
    publisher = Publisher(config)
    publisher.open()
    install_signal_handlers(publisher.stop_event)
    await publisher.serve()


def run(config: PublisherConfig) -> None:
    asyncio.run(_main(config))


def default_addr_file(data_dir: Path) -> Path:
    return data_dir / "publisher.addr"
