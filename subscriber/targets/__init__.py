"""Target databases: one package per dialect, found through one registry.

Each package under ``subscriber/targets/`` holds everything about one database:
the :class:`~subscriber.apply.Writer` the Spark apply writes batches through, its
staging helpers, and the shadow-table loader a snapshot goes through.  The apply
(:mod:`subscriber.apply`) knows only the Writer protocol; the snapshot client
(:mod:`subscriber.reinit`) only the :class:`~subscriber.reinit.ShadowLoader`
protocol.  This module maps a target URL's dialect (:class:`common.dburl.DatabaseUrl`)
to its package::

    sqlite       subscriber.targets.sqlite      SqliteWriter, SqliteSnapshotLoader
    postgresql   subscriber.targets.postgres    PostgresWriter, PostgresSnapshotLoader
    mariadb      subscriber.targets.mariadb     MariaWriter, MariaSnapshotLoader

A new target is one new package that exports what :class:`TargetPackage` lists,
plus its line in :data:`TARGETS` (and its scheme in ``common.dburl``).  A package
is imported when a URL of its dialect is first opened: a subscriber into SQLite
does not load psycopg or PyMySQL (~0.1 s of its start-up, which a restart after an
outage waits for).

It also builds the snapshot loader of a subscription, :func:`snapshot_loader`,
the one builder both ``txrepl subscriber reinit`` and the daemon use: the same
token (``token`` or ``token_file``), TLS / mutual TLS (:func:`publisher_channel`),
replay role, per-table options and Spark settings (:func:`spark_settings`,
executors included) whoever loads.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast

import grpc

from common.dburl import DatabaseUrl, Dialect
from common.security import client_channel, read_token_file
from subscriber.apply import ApplyOptions, SparkSettings, TableOptions, Writer
from subscriber.config import SubscriberConfig, SubscriptionConfig
from subscriber.reinit import ShadowLoader, SnapshotError, SnapshotProgress, load_into
from subscriber.targets import sqlite
from subscriber.targets.conflicts import ConflictGuard, policies_of, postgres_sql, sqlite_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "TARGETS",
    "TargetPackage",
    "attach_conflicts",
    "load_snapshot",
    "open_snapshot_loader",
    "open_writer",
    "publisher_channel",
    "resolve_token",
    "snapshot_loader",
    "snapshot_needs_spark",
    "spark_settings",
    "target_package",
    "updatable_options",
]


class TargetPackage(Protocol):
    """What a dialect's package exports for the registry."""

    SNAPSHOT_NEEDS_SPARK: bool  # its loader passes plain rows through Spark

    def open_writer(self, url: DatabaseUrl, config: Any = None) -> Writer: ...

    def open_snapshot_loader(
        self,
        url: DatabaseUrl,
        *,
        subscription: str,
        spark: SparkSession | None,
        role: str | None = None,
    ) -> ShadowLoader: ...


TARGETS: Mapping[Dialect, str] = {
    "sqlite": "subscriber.targets.sqlite",
    "postgresql": "subscriber.targets.postgres",
    "mariadb": "subscriber.targets.mariadb",
}


def target_package(url: DatabaseUrl) -> TargetPackage:
    """The package of ``url``'s dialect (imported on first use)."""
    module: ModuleType = importlib.import_module(TARGETS[url.dialect])
    return cast(TargetPackage, module)


def _url(target: DatabaseUrl | str | Path, base_dir: str | Path = ".") -> DatabaseUrl:
    if isinstance(target, DatabaseUrl):
        return target
    if isinstance(target, Path):
        return DatabaseUrl(f"sqlite:///{target}", "sqlite", target)
    return DatabaseUrl.parse(target, field="target", base_dir=base_dir)


def open_writer(
    url: DatabaseUrl | str, config: Any = None, *, base_dir: str | Path = "."
) -> Writer:
    """The writer for a target URL: ``sqlite:///PATH`` or ``postgresql://...``.

    ``config`` (a ``subscriber.config.ApplyConfig``, optional) gives the replay
    role and ``session_replication_role`` for PostgreSQL; a relative SQLite path
    in a string URL is taken relative to ``base_dir``.
    """
    target = _url(url, base_dir)
    return target_package(target).open_writer(target, config)


def attach_conflicts(writer: Writer, subscriptions: Any) -> None:
    r"""Give ``writer`` the conflict checks of the updatable ones among ``subscriptions``
    (``SubscriptionConfig``\ s; subscriber/targets/conflicts)."""
    policies = policies_of(subscriptions)
    if not policies:
        return
    if isinstance(writer, sqlite.SqliteWriter):
        dialect = sqlite_sql(sqlite.writer.sqlite_value)
    else:
        dialect = postgres_sql(getattr(writer, "replication_role", "replica"))
    writer.conflicts = ConflictGuard(dialect, policies)  # type: ignore[attr-defined]


def updatable_options(config: Any, *subscriptions: SubscriptionConfig) -> ApplyOptions:
    """The ``[apply]`` options (an ``ApplyConfig``), with the rows' commit times when one
    of ``subscriptions`` is updatable (latest_commit_wins and the log read them)."""
    options = ApplyOptions.from_config(config)
    if any(sc.conflicts for sc in subscriptions):
        options = dataclasses.replace(options, commit_times=True)
    return options


def open_snapshot_loader(
    url: DatabaseUrl, *, subscription: str, spark: SparkSession | None, role: str | None = None
) -> ShadowLoader:
    """The shadow-table loader of ``url``'s dialect (see its ``snapshot.py``)."""
    return target_package(url).open_snapshot_loader(
        url, subscription=subscription, spark=spark, role=role
    )


def load_snapshot(
    *,
    address: str,
    publisher: str,
    publication: str,
    subscriber: str,
    subscription: str,
    target: DatabaseUrl | Path | str,
    spark: SparkSession | None = None,
    channel: grpc.Channel | None = None,
    on_progress: Callable[[SnapshotProgress], None] | None = None,
    chunk_rows: int = 5000,
    role: str | None = None,
    tables: Mapping[str, TableOptions] | None = None,
) -> tuple[str, int]:
    """Load the publication's snapshot into ``target``; returns (incarnation, seq).

    ``target``: a URL (or a ``Path``: a SQLite file).  SQLite needs ``spark``;
    PostgreSQL uses it only for tables with transforms, and ``role`` as the replay
    role to create the tables as.  ``tables``: the subscriber's per-table options.
    """
    try:
        url = _url(target)
    except ValueError as exc:
        raise SnapshotError(
            f"target {target!r}: snapshots load into a SQLite file, postgresql://... or"
            " mariadb://..."
        ) from exc
    sink = open_snapshot_loader(url, subscription=subscription, spark=spark, role=role)
    return load_into(
        sink,
        address=address,
        publisher=publisher,
        publication=publication,
        subscriber=subscriber,
        spark=spark,
        channel=channel,
        on_progress=on_progress,
        chunk_rows=chunk_rows,
        tables=tables,
    )


# -- one builder for the reinit CLI and the daemon --------------------------------


def resolve_token(sc: SubscriptionConfig, config: SubscriberConfig) -> SubscriptionConfig:
    """The subscription with ``token`` read from ``token_file`` (if one is given);
    a ConfigError naming the subscription's ``token_file`` when it cannot be read."""
    if not sc.token_file:
        return sc
    token = read_token_file(config.path(sc.token_file), f"subscription {sc.id}: token_file")
    return dataclasses.replace(sc, token=token, token_file="")


def publisher_channel(
    config: SubscriberConfig, sc: SubscriptionConfig, *, token: str = ""
) -> grpc.Channel:
    """A blocking channel to ``sc``'s publisher, with the subscription's TLS settings
    (``tls``, ``ca_file``, ``cert_file``/``key_file``, ``tls_server_name``) and
    ``token`` on every call, through the one client builder (common.security)."""
    return client_channel(sc.address, sc.client_tls, config.path, token=token)


def spark_settings(config: SubscriberConfig) -> SparkSettings:
    """The SparkSession settings of ``[spark]`` (executors' cores, memory, Python too)."""
    return SparkSettings.from_config(config.spark)


def snapshot_needs_spark(config: SubscriberConfig) -> bool:
    """Whether loading a snapshot into this subscriber's target needs a Spark session:
    the dialect's loader does, or a table is shaped by transforms."""
    tables = ApplyOptions.from_config(config.apply).tables
    return target_package(config.target_url).SNAPSHOT_NEEDS_SPARK or any(
        t.shaped and not t.history for t in tables.values()
    )


def snapshot_loader(
    config: SubscriberConfig,
    sc: SubscriptionConfig,
    spark: SparkSession | None,
    *,
    on_progress: Callable[[SnapshotProgress], None] | None = None,
) -> Callable[[], tuple[str, int]]:
    """Loads subscription ``sc``'s snapshot into the target: (incarnation, seq) per call.

    The token is read (``token_file``) once, here; TLS files at each load, through the
    channel builder of every client (:func:`publisher_channel`); ``spark`` is the caller's session
    (None where :func:`snapshot_needs_spark` says none is needed).
    """
    sub = resolve_token(sc, config)
    tables = ApplyOptions.from_config(config.apply).tables
    role = config.apply.role or None

    def load() -> tuple[str, int]:
        try:
            channel = publisher_channel(config, sc, token=sub.token)
        except ValueError as e:  # a TLS file missing or unreadable
            raise SnapshotError(f"subscription {sc.id}: {e}") from None
        with channel:
            return load_snapshot(
                address=sc.address,
                publisher=sc.publisher,
                publication=sc.publication,
                subscriber=config.server_name,
                subscription=sc.id,
                target=config.target_url,
                spark=spark,
                channel=channel,
                on_progress=on_progress,
                role=role,
                tables=tables,
            )

    return load
