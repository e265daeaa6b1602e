"""Subscriber configuration (``subscriber.toml``), frozen and validated at start.

Example::

    server_name = "sub1"
    target = "sqlite:///var/target.db"    # or postgresql://user@host:port/db, mariadb://user@host:port/db
    control_listen = "127.0.0.1:7401"      # status / pause / resume / reconnect

    [spark]
    master = "local[2]"

    [[subscription]]
    publisher = "pub1"                     # the publisher's server name
    address = "127.0.0.1:7400"             # where it listens
    publication = "shop"
    # name = "pub1.shop"                   # default: <publisher>.<publication>
    # token_file = "secrets/pub1.token"    # sent as metadata x-txrepl-token
    # ca_file = "tls/ca.crt"               # TLS to the publisher (tls = true: system roots)
    # cert_file / key_file                 # client certificate for mutual TLS

Operations (see docs/operations.md): ``metrics_listen``, ``[tls]`` for the control
port, ``[auth] admin_token_hashes`` for control calls,
``allow_insecure_non_loopback``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Literal

from common.backoff import Backoff
from common.config import load_toml, parse_address
from common.dburl import DatabaseUrl
from common.names import parse_table
from common.security import ClientTls, ServerTls, check_hash, check_listen
from common.trace import check_every
from subscriber.conflictspec import parse_resolver
from subscriber.schedule import Schedule

__all__ = [
    "ApplyConfig",
    "BatchConfig",
    "ControlAuthConfig",
    "SparkConfig",
    "SubscriberConfig",
    "SubscriptionConfig",
    "TableApplyConfig",
    "load_config",
]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")


@dataclasses.dataclass(frozen=True)
class SubscriptionConfig:
    publisher: str
    address: str
    publication: str
    name: str = ""
    token: str = ""
    token_file: str = ""  # read at start; the token itself then never sits in the config
    tls: bool = False  # TLS to the publisher (implied by ca_file)
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    tls_server_name: str = ""  # name to check in the publisher's certificate
    schedule: Schedule = dataclasses.field(default_factory=Schedule)
    # How a new subscription (level 0) starts: "auto" replays the log from seq 1,
    # or loads a snapshot when seq 1 was purged; "snapshot" always loads one;
    # "log" never does.
    initial: Literal["auto", "log", "snapshot"] = "auto"
    # Failed attempts in a row (sessions that ended in error without progress) after
    # which the subscription is "broken" until an operator's unbreak; 0 (the default):
    # never.  Opt-in: our attempts are seconds apart ([backoff]), not Oracle's
    # doubling minutes, so a budget of 16 broke subscriptions on a few publisher
    # restarts in a row (tests/chaos/test_kill.py).
    retry_budget: int = 0
    # An updatable subscription: the target's rows may change locally, and its tables
    # are checked for conflicts when applying (docs/conflicts.md).  "" (the default):
    # no detection, the publisher's rows are upserted as they come.  Otherwise the
    # resolver (subscriber/conflictspec.py), overridden per source table by
    # conflict_tables ("off": that table unchecked).
    conflicts: str = ""
    conflict_tables: dict[str, str] = dataclasses.field(default_factory=dict)
    # latest_commit_wins: the target's column holding each row's last change time
    conflict_time_column: str = ""
    # Both ends of the subscription write the same rows (a pair, docs/topologies.md):
    # a row txrepl never wrote is a local change (not trusted), and a conflict decided
    # "ignore" leaves the key's version as it was (the publisher has not seen the row
    # kept here, so its next change of the key is checked again).
    conflict_pair: bool = False

    def __post_init__(self) -> None:
        self._check_conflicts()
        if self.retry_budget < 0:
            raise ValueError("retry_budget must be 0 (never broken) or more")
        for field in ("publisher", "publication"):
            if not _NAME.match(getattr(self, field)):
                raise ValueError(f"{field} {getattr(self, field)!r} is not a valid name")
        parse_address(self.address, field="address")
        if self.name and not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} is not a valid name")
        if self.token and self.token_file:
            raise ValueError("token and token_file: give one, not both")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together")

    def _check_conflicts(self) -> None:
        if self.conflicts:
            parse_resolver(self.conflicts, field="conflicts")
        elif self.conflict_tables:
            raise ValueError("conflict_tables needs conflicts (the subscription's resolver)")
        specs = [self.conflicts] if self.conflicts else []
        for table, text in self.conflict_tables.items():
            parse_table(table)
            if text != "off":
                specs.append(parse_resolver(text, field=f"conflict_tables.{table}").text)
        if self.conflict_pair and not self.conflicts:
            raise ValueError("conflict_pair needs conflicts (the subscription's resolver)")
        if "latest_commit_wins" in specs and not self.conflict_time_column:
            raise ValueError(
                "latest_commit_wins needs conflict_time_column (the target column holding "
                "each row's last change time)"
            )

    @property
    def client_tls(self) -> ClientTls | None:
        """TLS settings for the channel to the publisher, or None for plaintext."""
        if not (self.tls or self.ca_file or self.cert_file):
            return None
        return ClientTls(self.ca_file, self.cert_file, self.key_file, self.tls_server_name)

    @property
    def id(self) -> str:
        """The subscription's unique name (the level row on the target is keyed by it)."""
        return self.name or f"{self.publisher}.{self.publication}"


@dataclasses.dataclass(frozen=True)
class SparkConfig:
    """``[spark]``: the daemon's SparkSession (see docs/spark-cluster.md for clusters)."""

    master: str = "local[2]"  # or spark://host:7077, k8s://https://host:443, yarn
    conf: dict[str, str] = dataclasses.field(default_factory=dict)
    jars: list[str] = dataclasses.field(default_factory=list)  # shipped to executors
    shuffle_partitions: int = 2
    log_level: str = "WARN"
    executor_cores: int = 0  # spark.executor.cores (0: Spark's default)
    executor_memory: str = ""  # spark.executor.memory, e.g. "2g" ("": Spark's default)
    python: str = ""  # the executors' Python ("": this daemon's interpreter)
    # When the driver's JVM starts (subscriber/apply/lazy.py): "on_demand", once batches
    # of spark_min_rows row changes have kept coming for start_after_s seconds, or at the
    # first snapshot, transform or history table (a subscriber in sync never starts
    # one); "at_start", as the daemon starts (a catch-up finds it warm).
    start: str = "on_demand"
    start_after_s: float = 5.0  # 0: the first big batch begins the start

    def __post_init__(self) -> None:
        if self.start not in ("on_demand", "at_start"):
            raise ValueError(
                f"spark.start {self.start!r}: use 'on_demand' (the JVM starts when a batch "
                "first needs it) or 'at_start' (as the daemon starts)"
            )
        if not 0 <= self.start_after_s < float("inf"):
            raise ValueError(
                f"spark.start_after_s {self.start_after_s!r}: use a number of seconds >= 0 "
                "(0: the JVM starts at the first batch of spark_min_rows row changes)"
            )
        if self.executor_cores < 0:
            raise ValueError("spark.executor_cores must not be negative")
        if self.executor_memory and not re.fullmatch(r"[0-9]+[kmgtKMGT]?", self.executor_memory):
            raise ValueError(
                f"spark.executor_memory {self.executor_memory!r}: use a size such as 512m or 2g"
            )


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """How entries are grouped into one apply (one target transaction)."""

    max_entries: int = 64_000
    max_bytes: int = 16 * 1024 * 1024  # issue 21: large values, docs/benchmarks.md
    queue_batches: int = 16  # received batches waiting to be applied (back-pressure)
    # No longer used (issue 23): an apply takes whatever arrived while the previous one
    # ran, at once (natural batching, subscriber/batcher.py).  Still accepted, so a
    # configuration naming it loads; the daemon logs a warning when it is not 0.
    max_delay_ms: int = 0
    # While a batch is written to the target, the next one (if already received) is
    # planned: walk, decoding and the Spark net-effect job overlap the target's work.
    plan_ahead: bool = True
    # At most one Ack per this many ms, the latest level (subscriber/stream.py); 0: an
    # Ack after every applied batch.  The publisher needs only the latest level.
    ack_interval_ms: int = 5

    def __post_init__(self) -> None:
        for field in ("max_entries", "max_bytes", "queue_batches"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, not {getattr(self, field)}")
        if not 0 <= self.max_delay_ms <= 60_000:
            raise ValueError(f"max_delay_ms must be between 0 and 60000, not {self.max_delay_ms}")
        if not 0 <= self.ack_interval_ms <= 1_000:
            raise ValueError(
                f"ack_interval_ms must be between 0 and 1000, not {self.ack_interval_ms}"
            )


@dataclasses.dataclass(frozen=True)
class ControlAuthConfig:
    """Hashed admin tokens for the control service (empty: open, loopback by default)."""

    admin_token_hashes: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        for h in self.admin_token_hashes:
            check_hash(h)


@dataclasses.dataclass(frozen=True)
class TableApplyConfig:
    """``[apply.tables.<source table>]``: transforms (Spark SQL) and history mode."""

    target: str = ""  # another target table name
    rename: dict[str, str] = dataclasses.field(default_factory=dict)  # source -> target column
    drop: list[str] = dataclasses.field(default_factory=list)  # source columns not replicated
    computed: dict[str, str] = dataclasses.field(default_factory=dict)  # column -> expression
    filter: str = ""  # Spark SQL predicate; rows that leave it are deleted on the target
    history: bool = False  # keep every version (SCD type 2) instead of overwriting


@dataclasses.dataclass(frozen=True)
class ApplyConfig:
    """``[apply]``: how batches are written to the target (see docs/apply.md)."""

    role: str = ""  # PostgreSQL: SET LOCAL ROLE for the apply (the replay role)
    replication_role: Literal["replica", "origin", "local"] = "replica"
    error_policy: Literal["stop", "skip"] = "stop"  # after a poisoned entry is stored
    retries: int = 5  # attempts for transient target errors (connection lost, lock timeout)
    jdbc_min_rows: int = 0  # PostgreSQL: Spark JDBC staging from this many row changes (0: off)
    # Batches of plain tables with fewer row changes compute their net effect in the
    # driver (Arrow) instead of a Spark job, whose fixed cost bounds the in-sync lag
    # (docs/apply.md; 1,000,000 keeps catch-up batches in the driver too); 0 sends
    # every batch through Spark.
    spark_min_rows: int = 10_000
    # PostgreSQL targets: "off" commits batches of rows without waiting for the WAL's
    # fsync (as PostgreSQL's own apply worker does), and acknowledges a level only once
    # the target's flushed WAL passed it (subscriber/targets/postgres/_durable.py);
    # "on" commits with the server's own setting.  Other targets always commit durably.
    synchronous_commit: Literal["on", "off"] = "off"
    tables: dict[str, TableApplyConfig] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.retries < 1:
            raise ValueError("apply.retries must be at least 1")
        if self.jdbc_min_rows < 0:
            raise ValueError("apply.jdbc_min_rows must not be negative")
        if self.spark_min_rows < 0:
            raise ValueError("apply.spark_min_rows must not be negative")
        for name, table in self.tables.items():  # written as publications write them
            parse_table(name)
            if table.target:
                parse_table(table.target)


@dataclasses.dataclass(frozen=True)
class SubscriberConfig:
    server_name: str
    target: str
    subscription: list[SubscriptionConfig] = dataclasses.field(default_factory=list)
    control_listen: str = "127.0.0.1:7401"
    data_dir: str = "var/subscriber"
    spark: SparkConfig = dataclasses.field(default_factory=SparkConfig)
    batch: BatchConfig = dataclasses.field(default_factory=BatchConfig)
    backoff: Backoff = dataclasses.field(default_factory=Backoff)
    metrics_listen: str = "127.0.0.1:9465"
    allow_insecure_non_loopback: bool = False
    tls: ServerTls = dataclasses.field(default_factory=ServerTls)
    auth: ControlAuthConfig = dataclasses.field(default_factory=ControlAuthConfig)
    config_dir: str = "."
    apply: ApplyConfig = dataclasses.field(default_factory=ApplyConfig)
    # Debug (common/trace.py): trace the stages of every Nth seq into
    # <data_dir>/trace.jsonl (at exit and on SIGUSR2); 0: off.
    trace_every: int = 0

    def __post_init__(self) -> None:
        check_every(self.trace_every)
        if not _NAME.match(self.server_name):
            raise ValueError(f"server_name {self.server_name!r} is not a valid name")
        parse_address(self.control_listen, field="control_listen")
        _ = self.target_url  # parsed once: refused here, naming the field and the forms
        pairs = [(s.publisher, s.publication) for s in self.subscription]
        twice = sorted({f"{a}.{b}" for a, b in pairs if pairs.count((a, b)) > 1})
        if twice:
            raise ValueError(
                f"publication subscribed twice: {', '.join(twice)} (the publisher keeps one "
                "level per subscriber server and publication)"
            )
        if any(s.conflicts for s in self.subscription):
            self._check_updatable()
        ids = [s.id for s in self.subscription]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"subscription names must be unique; repeated: {sorted(dup)}")
        check_listen(
            self.control_listen,
            field="control_listen",
            tls=self.tls.enabled,
            allow_insecure=self.allow_insecure_non_loopback,
        )
        if self.metrics_listen:
            parse_address(self.metrics_listen, field="metrics_listen")
        files = [(f"tls.{k}", getattr(self.tls, k)) for k in ("cert_file", "key_file")]
        files.append(("tls.client_ca_file", self.tls.client_ca_file))
        for i, s in enumerate(self.subscription):
            for k in ("token_file", "ca_file", "cert_file", "key_file"):
                files.append((f"subscription[{i}].{k}", getattr(s, k)))
        for key, value in files:
            if value and not self.path(value).is_file():
                raise ValueError(f"{key}: {str(self.path(value))!r} is not a readable file")

    def _check_updatable(self) -> None:
        """What conflict detection does not cover yet is refused, not half done."""
        if self.target_url.dialect not in ("sqlite", "postgresql"):
            raise ValueError(
                f"conflicts: conflict detection runs on SQLite and PostgreSQL targets, not "
                f"{self.target_url.dialect}; remove conflicts from the subscription"
            )
        if self.apply.jdbc_min_rows:
            raise ValueError(
                "conflicts: an updatable subscription cannot stage through Spark JDBC; "
                "set apply.jdbc_min_rows = 0"
            )
        shaped = sorted(
            name
            for name, t in self.apply.tables.items()
            if t.target or t.history or t.rename or t.drop or t.computed or t.filter
        )
        if shaped:
            raise ValueError(
                f"conflicts: tables with transforms or history ({', '.join(shaped)}) are not "
                "checked for conflicts yet; drop their [apply.tables] entries or conflicts"
            )

    def path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else Path(self.config_dir) / p

    @property
    def data_path(self) -> Path:
        return self.path(self.data_dir)

    @functools.cached_property
    def target_url(self) -> DatabaseUrl:
        """``target`` parsed (a relative SQLite path is relative to the config file)."""
        return DatabaseUrl.parse(self.target, field="target", base_dir=self.config_dir)


def load_config(path: str | Path) -> SubscriberConfig:
    return load_toml(SubscriberConfig, path)
