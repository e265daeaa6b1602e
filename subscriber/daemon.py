"""The subscriber daemon: one SparkSession, one runner per subscription, a control port.

Start-up: validate the config, start the long-lived SparkSession, open the
target for each subscription and read its level, bind the control port, write
``<data_dir>/subscriber.addr``, then READY.  Each subscription runs in its own
task, so one subscription's cut, error or pause never stalls another.

Shutdown (SIGTERM): health NOT_SERVING, STOPPING=1, each runner stops reading,
the batch in flight commits (with its level) and is acked, then the Spark
session and the server stop.  A second signal forces exit.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from common.rpc import txrepl_pb2_grpc as rpc
from common.serve import GrpcEndpoint, install_signal_handlers, write_atomic
from common.systemd import Notifier
from subscriber.apply import Applier, SparkSettings, SqliteWriter, create_spark_session
from subscriber.config import SubscriberConfig
from subscriber.connection import SubscriptionRunner
from subscriber.control import ControlService

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Subscriber", "run"]

log = structlog.get_logger(__name__)


class Subscriber:
    def __init__(self, config: SubscriberConfig) -> None:
        self.config = config
        self.stop_event = asyncio.Event()
        self.notifier = Notifier()
        self.runners: dict[str, SubscriptionRunner] = {}
        self.spark: SparkSession | None = None

    def open(self) -> None:
        cfg = self.config
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        if not cfg.target.startswith("sqlite:///"):
            from common.config import ConfigError

            raise ConfigError("target", "target", "only sqlite:/// targets in this build")
        s = cfg.spark
        self.spark = create_spark_session(
            SparkSettings(
                master=s.master,
                conf=dict(s.conf),
                jars=tuple(s.jars),
                shuffle_partitions=s.shuffle_partitions,
                log_level=s.log_level,
            )
        )
        for sc in cfg.subscription:
            writer = SqliteWriter(cfg.sqlite_target_path)
            applier = Applier(self.spark, writer, subscription=sc.id)
            self.runners[sc.id] = SubscriptionRunner(
                sc, cfg.server_name, applier, batch=cfg.batch, backoff=cfg.backoff
            )

    async def serve(self) -> None:
        cfg = self.config
        control = ControlService(cfg.server_name, self.runners)
        endpoint = GrpcEndpoint(
            cfg.control_listen,
            [lambda s: rpc.add_SubscriberControlServicer_to_server(control, s)],
            ["txrepl.v1.SubscriberControl"],
        )
        await endpoint.start()
        tasks = [asyncio.create_task(r.run(), name=f"sub-{n}") for n, r in self.runners.items()]
        write_atomic(cfg.data_path / "subscriber.addr", endpoint.address + "\n")
        log.info(
            "subscriber ready",
            server=cfg.server_name,
            control=endpoint.address,
            subscriptions={n: r.level for n, r in self.runners.items()},
        )
        self.notifier.ready(f"control on {endpoint.address}")
        try:
            await self.stop_event.wait()
        finally:
            log.info("subscriber stopping")
            await endpoint.not_serving()
            self.notifier.stopping()
            for r in self.runners.values():
                r.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await endpoint.stop(grace=2.0)
            if self.spark is not None:
                self.spark.stop()
            log.info("subscriber stopped", levels={n: r.level for n, r in self.runners.items()})


async def _main(config: SubscriberConfig) -> None:
    sub = Subscriber(config)
    sub.open()
    install_signal_handlers(sub.stop_event)
    await sub.serve()


def run(config: SubscriberConfig) -> None:
    asyncio.run(_main(config))
