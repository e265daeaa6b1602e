"""The subscriber daemon: one SparkSession, one runner per subscription, a control port.

Start-up: validate the config, start the long-lived SparkSession in a thread
(subscriber/apply/lazy.py: small in-sync batches need no Spark job, so the
subscriptions do not wait for the JVM), open the target for each subscription and
read its level, bind the control port, write
``<data_dir>/subscriber.addr``, start the metrics endpoint (``metrics.addr``),
then READY.  The watchdog is pinged while the event loop and Spark's JVM live.
Each subscription runs in its own task, so one subscription's cut, error or
pause never stalls another.

Health (common/health.py): ``txrepl.subscription.<id>`` per subscription is
NOT_SERVING in ``error`` or ``invalid``; the whole subscriber (``""``) when
every subscription is.

Shutdown (SIGTERM): health NOT_SERVING, STOPPING=1, each runner stops reading,
the batch in flight commits (with its level) and is acked, then the Spark
session and the server stop; exit status 0.  A second signal forces exit.

Each subscription's channel to its publisher comes from a ``channel_factory``
built here: TLS (and a client certificate for mutual TLS) when the
subscription configures it.  Batch sizes, durations and apply errors are
measured by :class:`MeteredApplier`; everything else is read from the runners
at scrape time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc
import structlog
from prometheus_client import Counter, Histogram

from common import metrics
from common.daemon import serve_daemon
from common.health import HealthBoard, Reading, health_loop
from common.latency import StageLatency
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import (
    AuthInterceptor,
    Principal,
    TokenBook,
    aio_channel_factory,
    server_credentials,
)
from common.serve import (
    GrpcEndpoint,
    check_can_listen,
    freeze_imports,
    install_signal_handlers,
)
from common.systemd import Notifier
from subscriber.apply import (
    AnyEntry,
    Applier,
    ApplyResult,
    Planned,
    SparkSettings,
    Writer,
    create_spark_session,
)
from subscriber.apply._wire import warm_arrow
from subscriber.apply.engine import warm_up_awhile
from subscriber.apply.lazy import LazySpark, spark_starting
from subscriber.config import SubscriberConfig
from subscriber.control import AUTH_RULES, ControlService
from subscriber.reinit.progress import ProgressBoard
from subscriber.subscription import STATES, SubscriptionRunner
from subscriber.targets import (
    attach_conflicts,
    open_writer,
    resolve_token,
    snapshot_loader,
    spark_settings,
    updatable_options,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Subscriber", "run"]

# States that wait for a person (subscriber/state.py): the subscription does not serve.
STUCK = ("error", "invalid", "broken")

log = structlog.get_logger(__name__)


_ENTRY_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10_000, 50_000)
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ApplyMetrics:
    """Histograms and counters of batch applies, in one daemon's registry."""

    def __init__(self, registry: Any) -> None:
        def doc(name: str) -> str:
            return metrics.METRICS[name][2]

        self.entries = Histogram(
            "txrepl_apply_batch_entries",
            doc("txrepl_apply_batch_entries"),
            ["subscription"],
            buckets=_ENTRY_BUCKETS,
            registry=registry,
        )
        self.rows = Histogram(
            "txrepl_apply_batch_rows",
            doc("txrepl_apply_batch_rows"),
            ["subscription"],
            buckets=(0, *_ENTRY_BUCKETS, 100_000, 500_000),
            registry=registry,
        )
        self.seconds = Histogram(
            "txrepl_apply_batch_seconds",
            doc("txrepl_apply_batch_seconds"),
            ["subscription"],
            buckets=_SECONDS_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "txrepl_apply_errors",
            doc("txrepl_apply_errors"),
            ["subscription", "error"],
            registry=registry,
        )


class MeteredApplier(Applier):
    """An Applier that measures each batch and remembers the newest applied commit time."""

    def __init__(
        self, spark: SparkSession, writer: Writer, subscription: str, meters: ApplyMetrics | None
    ) -> None:
        super().__init__(spark, writer, subscription)
        self.meters = meters
        self.last_commit_time: float | None = None
        self._children: tuple[Any, ...] | None = None  # the meters' children of this subscription

    def apply(
        self,
        first_seq: int,
        entries: Sequence[AnyEntry],
        *,
        incarnation: str,
        planned: Planned | None = None,
        hold: bool = False,
    ) -> ApplyResult:
        started = time.perf_counter()
        try:
            result = super().apply(
                first_seq, entries, incarnation=incarnation, planned=planned, hold=hold
            )
        except Exception as e:
            if self.meters is not None:
                self.meters.errors.labels(self.subscription, type(e).__name__).inc()
            raise
        if entries and not hold:
            self.last_commit_time = entries[-1].commit_time_us / 1e6
        if self.meters is not None and entries:
            if self._children is None:  # labels() looks them up: ~10 us a call
                m = self.meters
                self._children = tuple(
                    h.labels(self.subscription) for h in (m.entries, m.rows, m.seconds)
                )
            entries_h, rows_h, seconds_h = self._children
            entries_h.observe(len(entries))
            rows_h.observe(result.rows)
            seconds_h.observe(time.perf_counter() - started)
        return result


class SubscriberCollector:
    """Reads each runner's level, head and state at scrape time."""

    def __init__(self, subscriber: Subscriber) -> None:
        self.subscriber = subscriber

    def collect(self) -> Iterator[Any]:
        sub = self.subscriber
        info = metrics.gauge("txrepl_info")
        info.add_metric(["subscriber", sub.config.server_name], 1)
        yield info
        level = metrics.gauge("txrepl_subscription_level")
        head = metrics.gauge("txrepl_subscription_head")
        lag = metrics.gauge("txrepl_subscription_lag_entries")
        lag_s = metrics.gauge("txrepl_subscription_lag_seconds")
        state = metrics.gauge("txrepl_subscription_state")
        entries = metrics.counter("txrepl_subscription_applied_entries")
        rows = metrics.counter("txrepl_subscription_applied_rows")
        conflicts = metrics.counter("txrepl_subscription_conflicts")
        now = time.time()
        for name, r in sorted(sub.runners.items()):
            h = max(r.head, r.level)
            level.add_metric([name], r.level)
            head.add_metric([name], h)
            lag.add_metric([name], h - r.level)
            applier = r.applier
            last = applier.last_commit_time if isinstance(applier, MeteredApplier) else None
            if h == r.level:
                lag_s.add_metric([name], 0.0)
            elif last is not None:
                lag_s.add_metric([name], max(0.0, now - last))
            for labels, v in metrics.state_gauge([name], r.state, STATES):
                state.add_metric(labels, v)
            entries.add_metric([name], r.applied_entries)
            rows.add_metric([name], r.applied_rows)
            for table, n in sorted(r.conflicts().items()):
                conflicts.add_metric([name, table], n)
        yield from (level, head, lag, lag_s, state, entries, rows, conflicts)
        yield from sub.health.collect()


class Subscriber:
    def __init__(self, config: SubscriberConfig) -> None:
        self.config = config
        self.stop_event = asyncio.Event()
        self.notifier = Notifier()
        self.runners: dict[str, SubscriptionRunner] = {}
        self.spark: SparkSession | None = None
        self.metrics_registry = metrics.new_registry() if config.metrics_listen else None
        self.metrics_server: metrics.MetricsServer | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.endpoint: GrpcEndpoint | None = None
        self.health = HealthBoard()
        self.loads = ProgressBoard(config.data_path)  # snapshot loads under way, for status

    def open(self) -> None:
        cfg = self.config
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        if cfg.batch.max_delay_ms:
            log.warning(
                "[batch] max_delay_ms is no longer used: an apply takes what arrived while "
                "the previous one ran, at once (natural batching); remove the setting",
                max_delay_ms=cfg.batch.max_delay_ms,
            )
        # Started in a thread, at once or when first needed (subscriber/apply/lazy.py):
        # the subscriptions connect and apply meanwhile; a Spark job waits for it.
        settings = spark_settings(cfg)  # executors' settings too
        lazy = LazySpark(
            lambda: _warmed(settings),
            at_once=cfg.spark.start == "at_start",
            start_after_s=cfg.spark.start_after_s,
        )
        self.spark = cast("SparkSession", lazy)
        meters = ApplyMetrics(self.metrics_registry) if self.metrics_registry else None
        stages = StageLatency(
            "txrepl_subscription_stage_seconds", "subscription", self.metrics_registry
        )
        for sc in cfg.subscription:
            writer = open_writer(cfg.target_url, cfg.apply)
            attach_conflicts(writer, [sc])  # an updatable subscription's checks
            applier = MeteredApplier(self.spark, writer, sc.id, meters)
            applier.configure(updatable_options(cfg.apply, sc))  # policy, retries, shapes
            sub = resolve_token(sc, cfg)
            self.runners[sc.id] = SubscriptionRunner(
                sub,
                cfg.server_name,
                applier,
                batch=cfg.batch,
                backoff=cfg.backoff,
                channel_factory=aio_channel_factory(sc.client_tls, cfg.path, token=sub.token),
                # The same builder as ``txrepl subscriber reinit`` (subscriber/targets).
                snapshot=self.loads.tracked(
                    sc.id,
                    snapshot_loader(cfg, sc, self.spark, on_progress=self.loads.reporter(sc.id)),
                ),
                stages=stages,
            )

    async def serve(self) -> None:
        cfg = self.config
        control = ControlService(cfg.server_name, self.runners, self.loads.current)
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if cfg.auth.admin_token_hashes:
            book = TokenBook((h, Principal("admin", "admin")) for h in cfg.auth.admin_token_hashes)
            interceptors.append(AuthInterceptor(book, AUTH_RULES))
        self.endpoint = endpoint = GrpcEndpoint(
            cfg.control_listen,
            [lambda s: rpc.add_SubscriberControlServicer_to_server(control, s)],
            ["txrepl.v1.SubscriberControl"],
            credentials=server_credentials(cfg.tls, cfg.path),
            interceptors=interceptors,
            key="control_listen",
        )
        await serve_daemon(
            self,
            name="subscriber",
            endpoint=endpoint,
            data_dir=cfg.data_path,
            metrics_listen=cfg.metrics_listen,
            ready_status=lambda address: f"control on {address}",
            grace=2.0,
            log=log,
        )

    def start_work(self) -> None:
        """One task per subscription, so one's cut, error or pause never stalls another."""
        self.tasks = [
            asyncio.create_task(r.run(), name=f"sub-{n}") for n, r in self.runners.items()
        ]

    def open_metrics(self) -> Any:
        if self.metrics_registry is not None:
            self.metrics_registry.register(SubscriberCollector(self))
        return self.metrics_registry

    def ready_fields(self, address: str) -> dict[str, Any]:
        cfg = self.config
        return {
            "server": cfg.server_name,
            "control": address,
            "tls": cfg.tls.enabled,
            "control_auth": bool(cfg.auth.admin_token_hashes),
            "subscriptions": {n: r.level for n, r in self.runners.items()},
        }

    async def healthy(self) -> bool:
        """While the loop turns and Spark's JVM answers; systemd restarts us otherwise."""
        return await asyncio.to_thread(self._spark_alive)

    def background(self) -> list[Coroutine[Any, Any, None]]:
        assert self.endpoint is not None
        return [health_loop(self.endpoint, self._health, self.health)]

    def _health(self) -> Reading:
        """Each subscription, and the whole subscriber: not when every one is stuck."""
        comps = {f"txrepl.subscription.{n}": r.state not in STUCK for n, r in self.runners.items()}
        why = {f"txrepl.subscription.{n}": f"{r.state}: {r.st.last_error}"
               for n, r in self.runners.items() if r.state in STUCK}  # fmt: skip
        overall = not comps or any(comps.values())
        if not overall:
            why[""] = "every subscription is in error or invalid"
        return overall, comps, why

    async def drain(self) -> None:
        """Each runner stops reading; the batch in flight commits with its level and is acked."""
        for r in self.runners.values():
            r.stop()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.notifier.status("drained: " + _levels(self.runners))

    def close(self) -> None:
        spark: Any = self.spark
        if isinstance(spark, LazySpark) and (spark.idle or spark.failed):
            return  # never started (on_demand), or failed to: nothing to stop
        if spark is not None:
            spark.stop()

    def stopped_fields(self) -> dict[str, Any]:
        return {"levels": {n: r.level for n, r in self.runners.items()}}

    def _spark_alive(self) -> bool:
        if self.spark is None or spark_starting(self.spark):
            return True  # starting: the watchdog waits for it, as it did in open()
        try:
            return not self.spark.sparkContext._jsc.sc().isStopped()
        except Exception:
            return False


def _warmed(settings: SparkSettings) -> SparkSession:
    """A new session, warmed for at most ``Applier.WARM_UP_WAIT_S`` (engine.py)."""
    spark = create_spark_session(settings)
    warm_up_awhile(spark, Applier.WARM_UP_WAIT_S)
    return spark


def _levels(runners: dict[str, SubscriptionRunner]) -> str:
    return ", ".join(f"{n} at {r.level}" for n, r in sorted(runners.items())) or "none"


async def _main(config: SubscriberConfig) -> None:
    check_can_listen("control_listen", config.control_listen)
    check_can_listen("metrics_listen", config.metrics_listen)
    sub = Subscriber(config)
    sub.open()
    install_signal_handlers(sub.stop_event)
    await sub.serve()


def run(config: SubscriberConfig) -> None:
    warm_arrow()  # pandas and the kernels: not in the first batch (subscriber/apply/_wire.py)
    freeze_imports()
    asyncio.run(_main(config))
