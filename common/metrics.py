"""Prometheus metrics: the HTTP endpoint and the building blocks of each daemon's collector.

Each daemon owns one :class:`prometheus_client.CollectorRegistry` (never the
global one, so several daemons can live in one test process).  Gauges that
describe state (heads, levels, lag, feed queues) are read from the live objects
at scrape time by a custom collector; counters and histograms of events (cuts,
batches, apply errors) are updated where the event happens.

Every metric name the daemons export is listed in :data:`METRICS`, with its
help text; ``docs/operations.md`` and the Grafana dashboard use the same names
(a test checks the dashboard against this list).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import start_http_server

from common._serve_stop import stop_serving
from common.config import parse_address
from common.errors import ListenError

__all__ = [
    "METRICS",
    "MetricsServer",
    "counter",
    "gauge",
    "new_registry",
    "state_gauge",
]

log = structlog.get_logger(__name__)

# name → (type, labels, help).  Histograms and counters are listed without suffixes.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    # both daemons
    "txrepl_info": ("gauge", ("role", "server"), "1, labelled with the daemon's role and name"),
    "txrepl_build_info": (
        "gauge",
        ("version", "python", "implementation"),
        "1, labelled with the txrepl version and the Python running it",
    ),
    "txrepl_health_serving": (
        "gauge",
        ("service",),
        "1 SERVING, 0 NOT_SERVING, per gRPC health service ('' = the whole daemon; "
        "txrepl.capture.<publication>, txrepl.subscription.<id>: common/health.py)",
    ),
    # publisher
    "txrepl_publication_head": ("gauge", ("publication",), "last committed seq"),
    "txrepl_publication_first_retained": (
        "gauge",
        ("publication",),
        "lowest seq still in the log",
    ),
    "txrepl_publication_log_bytes": ("gauge", ("publication",), "bytes of log segments on disk"),
    "txrepl_publication_last_commit_timestamp_seconds": (
        "gauge",
        ("publication",),
        "commit time of the newest entry (unix seconds)",
    ),
    "txrepl_capture_entries": ("counter", (), "entries appended by capture since start"),
    "txrepl_capture_failures": ("counter", (), "failed capture attempts since start"),
    "txrepl_capture_failures_in_a_row": (
        "gauge",
        (),
        "failed capture attempts since the last good one (health: NOT_SERVING from 3)",
    ),
    "txrepl_capture_lock_waits": (
        "counter",
        (),
        "SQLite source: times capture waited for another connection's write lock",
    ),
    "txrepl_pg_slot_lag_bytes": (
        "gauge",
        ("publication", "slot"),
        "PostgreSQL source: WAL bytes the replication slot still holds (current LSN - "
        "confirmed flush LSN); the source's disk grows with it",
    ),
    "txrepl_pg_slot_lag_seconds": (
        "gauge",
        ("publication", "slot"),
        "PostgreSQL source: flush lag the walsender measures while capture streams; "
        "while it does not, seconds since capture last streamed (0 when caught up)",
    ),
    "txrepl_publication_stage_seconds": (
        "histogram",
        ("publication", "stage"),
        "latency of one leg of an entry's path in the publisher: poll (SQLite source: "
        "last write -> the check that saw the commit), capture (source commit "
        "-> append), durable (append -> fsynced and visible), send (visible -> written "
        "to a feed); common/latency.py",
    ),
    "txrepl_subscriber_level": ("gauge", ("publication", "subscriber"), "acked level"),
    "txrepl_subscriber_lag_entries": ("gauge", ("publication", "subscriber"), "head - level"),
    "txrepl_subscriber_lag_seconds": (
        "gauge",
        ("publication", "subscriber"),
        "age of the oldest entry the subscriber lacks",
    ),
    "txrepl_subscriber_valid": ("gauge", ("publication", "subscriber"), "1 valid, 0 invalid"),
    "txrepl_subscriber_state": (
        "gauge",
        ("publication", "subscriber", "state"),
        "1 for the subscriber's current state in the registry",
    ),
    "txrepl_subscriber_cuts": (
        "counter",
        ("publication", "subscriber"),
        "feed cuts recorded in the registry (all time)",
    ),
    "txrepl_feed_cuts": (
        "counter",
        ("publication", "reason"),
        "feed cuts since start, by kind (CutKind: queue_threshold, send_timeout, ...)",
    ),
    "txrepl_feed_queue_entries": (
        "gauge",
        ("publication", "subscriber"),
        "entries committed but not yet acked by a connected feed (head - acked)",
    ),
    "txrepl_feed_in_flight_entries": (
        "gauge",
        ("publication", "subscriber"),
        "entries sent but not yet acked",
    ),
    "txrepl_feeds": ("gauge", ("publication", "state"), "connected feeds"),
    # subscriber
    "txrepl_subscription_level": ("gauge", ("subscription",), "level durably applied"),
    "txrepl_subscription_head": ("gauge", ("subscription",), "last head the publisher reported"),
    "txrepl_subscription_lag_entries": ("gauge", ("subscription",), "head - level"),
    "txrepl_subscription_lag_seconds": (
        "gauge",
        ("subscription",),
        "0 when caught up, else age of the newest applied entry (an upper bound)",
    ),
    "txrepl_subscription_state": (
        "gauge",
        ("subscription", "state"),
        "1 for the subscription's current state",
    ),
    "txrepl_subscription_applied_entries": ("counter", ("subscription",), "entries applied"),
    "txrepl_subscription_applied_rows": ("counter", ("subscription",), "row changes applied"),
    "txrepl_subscription_conflicts": (
        "counter",
        ("subscription", "table"),
        "conflicts detected and resolved (updatable subscriptions)",
    ),
    "txrepl_apply_batch_entries": ("histogram", ("subscription",), "entries per applied batch"),
    "txrepl_apply_batch_rows": ("histogram", ("subscription",), "row changes per applied batch"),
    "txrepl_apply_batch_seconds": (
        "histogram",
        ("subscription",),
        "wall time of one batch apply (Spark and target commit)",
    ),
    "txrepl_subscription_stage_seconds": (
        "histogram",
        ("subscription", "stage"),
        "latency of one leg of an entry's path in the subscriber: receive (publisher "
        "send -> read), queue (read -> taken by an apply), apply (planning), commit "
        "(target transaction), total (source commit -> target commit); common/latency.py",
    ),
    "txrepl_apply_errors": ("counter", ("subscription", "error"), "failed batch applies"),
}


def new_registry() -> CollectorRegistry:
    """A daemon's registry, with the process and platform collectors and build info.

    ``process_*`` (CPU seconds, resident memory, open fds, start time) and
    ``python_info`` come from prometheus_client's own collectors, registered on this
    registry rather than the global one; ``python_gc_*`` likewise.
    """
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(_BuildInfo())
    return registry


class _BuildInfo:
    """``txrepl_build_info{version, python, implementation} 1``."""

    def __init__(self) -> None:
        try:
            self.version = package_version("txrepl")
        except PackageNotFoundError:
            self.version = "unknown"

    def collect(self) -> Iterator[Any]:
        info = gauge("txrepl_build_info")
        info.add_metric([self.version, platform.python_version(), sys.implementation.name], 1)
        yield info


def _family(kind: str, name: str, extra: Sequence[str] = ()) -> Any:
    declared, labels, doc = METRICS[name]
    assert declared == kind, f"{name} is declared a {declared}"
    cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
    return cls(name, doc, labels=[*labels, *extra])


def gauge(name: str) -> Any:
    """An empty gauge family for ``name``, labelled as declared in :data:`METRICS`."""
    return _family("gauge", name)


def counter(name: str) -> Any:
    return _family("counter", name)


def state_gauge(
    labels: Sequence[str], current: str, states: Iterable[str]
) -> list[tuple[list[str], float]]:
    """Samples of an enum-style gauge: 1 for ``current``, 0 for the other ``states``."""
    return [([*labels, s], 1.0 if s == current else 0.0) for s in states]


class MetricsServer:
    """The /metrics HTTP endpoint on ``listen`` (port 0 picks a free port)."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        self.listen = listen
        self.registry = registry
        self._httpd: Any = None
        self.address = ""

    def start(self) -> str:
        host, port = parse_address(self.listen, field="metrics_listen")
        try:
            self._httpd, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise ListenError("metrics_listen", self.listen, e.strerror or str(e)) from None
        bound = self._httpd.server_address[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        log.info("metrics endpoint listening", metrics=f"http://{self.address}/metrics")
        return self.address

    def stop(self) -> None:
        if self._httpd is not None:
            stop_serving(self._httpd)  # not up to 0.5 s: common/_serve_stop.py
            self._httpd.server_close()
            self._httpd = None
