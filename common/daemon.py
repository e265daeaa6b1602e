"""The life cycle both daemons share: start, READY, watchdog, wait, ordered drain.

Each daemon builds its :class:`~common.serve.GrpcEndpoint` (its services, its
interceptors) and implements :class:`DaemonParts` (its background work, its
health, its stop steps); :func:`serve_daemon` runs the same sequence for both.

Start-up, in this order (before it, each daemon's ``_main`` checks that its
ports can be bound, :func:`~common.serve.check_can_listen`, so a busy port
changes nothing):

1. start the gRPC endpoint (health SERVING) — the port accepts before READY;
2. ``start_work()``: the daemon's own work (the subscriber's subscription tasks;
   the publisher's snapshots and reshapes: its capture started before the
   endpoint, publisher/daemon.py);
3. the optional metrics server, and ``metrics.addr`` with its bound address;
4. freeze the start-up heap (:func:`~common.serve.freeze_startup_heap`), last,
   so what start-up allocated stays out of later full collections;
5. ``<name>.addr`` with the endpoint's bound address (port 0 works), written
   after everything it announces is up;
6. log ``"<name> ready"`` with the daemon's fields, systemd ``READY=1``, then
   the optional ``ready`` event;
7. the watchdog task (pinged at a third of ``WatchdogSec`` while ``healthy()``)
   and the daemon's ``background()`` tasks.

Then wait for the stop event (the first SIGTERM/SIGINT).  The drain, in this
order, and why:

1. cancel the watchdog and background tasks, log ``"<name> stopping"``;
2. health NOT_SERVING first, so load balancers and clients stop sending new
   calls before anything is taken away;
3. systemd ``STOPPING=1``;
4. ``drain()``: the daemon's own stop steps (stop producing, finish the work in
   flight) — before the endpoint stops, so open streams still carry their last
   acks and cuts;
5. the endpoint stops with the daemon's grace period;
6. the metrics server stops (it reads the daemon's state until here);
7. ``close()``: release what the work used (logs, source, registry, Spark),
   after everything that could still touch it has stopped;
8. log ``"<name> stopped"`` with ``stopped_fields()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from common import metrics
from common.serve import GrpcEndpoint, freeze_startup_heap, write_atomic
from common.systemd import Notifier

__all__ = ["DaemonParts", "serve_daemon"]


class DaemonParts(Protocol):
    """What a daemon brings to :func:`serve_daemon`; the rest is shared."""

    notifier: Notifier
    stop_event: asyncio.Event
    metrics_server: metrics.MetricsServer | None

    def start_work(self) -> None:
        """Start the daemon's own work once the endpoint listens."""

    def open_metrics(self) -> Any | None:
        """The Prometheus registry to serve, or None when metrics are off."""

    def ready_fields(self, address: str) -> dict[str, Any]:
        """The fields of the ``ready`` log line."""

    async def healthy(self) -> bool:
        """Whether to ping the systemd watchdog this round."""

    def background(self) -> list[Coroutine[Any, Any, None]]:
        """Coroutines run from READY until the stop event, then cancelled."""

    async def drain(self) -> None:
        """The daemon's own stop steps, before the endpoint stops."""

    def close(self) -> None:
        """Release what the work used, after everything has stopped."""

    def stopped_fields(self) -> dict[str, Any]:
        """The fields of the ``stopped`` log line."""


async def serve_daemon(
    parts: DaemonParts,
    *,
    name: str,
    endpoint: GrpcEndpoint,
    data_dir: Path,
    metrics_listen: str,
    ready_status: Callable[[str], str],
    grace: float,
    log: Any,
    ready: asyncio.Event | None = None,
) -> None:
    """Run ``parts`` from endpoint start to the end of the drain (module docstring)."""
    await endpoint.start()
    try:
        parts.start_work()
        registry = parts.open_metrics() if metrics_listen else None
        if registry is not None:
            parts.metrics_server = metrics.MetricsServer(metrics_listen, registry)
            address = parts.metrics_server.start()
            write_atomic(data_dir / "metrics.addr", address + "\n")
    except BaseException:
        # The metrics port was taken after check_can_listen: undo the start, so the
        # ListenError leaves as one line and no half-started daemon lingers.
        await parts.drain()
        await endpoint.stop(grace=0)
        parts.close()
        raise
    freeze_startup_heap()
    write_atomic(data_dir / f"{name}.addr", endpoint.address + "\n")
    log.info(f"{name} ready", **parts.ready_fields(endpoint.address))
    parts.notifier.ready(ready_status(endpoint.address))
    if ready is not None:
        ready.set()
    tasks = [asyncio.create_task(_watchdog(parts))]
    tasks += [asyncio.create_task(c) for c in parts.background()]
    try:
        await parts.stop_event.wait()
    finally:
        for task in tasks:
            task.cancel()
        log.info(f"{name} stopping")
        await endpoint.not_serving()
        parts.notifier.stopping()
        await parts.drain()
        await endpoint.stop(grace=grace)
        if parts.metrics_server is not None:
            parts.metrics_server.stop()
        parts.close()
        log.info(f"{name} stopped", **parts.stopped_fields())


async def _watchdog(parts: DaemonParts) -> None:
    if not parts.notifier.watchdog_s:
        return
    while True:
        if await parts.healthy():
            parts.notifier.watchdog()
        await asyncio.sleep(parts.notifier.watchdog_s / 3)
