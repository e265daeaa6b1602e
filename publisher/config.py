"""Publisher configuration (``publisher.toml``), frozen and validated at start.

Example::

    server_name = "pub1"
    node = "paris"                      # the source as a node (origins, docs/topologies.md);
                                        # default: server_name, or the name already recorded
    listen = "127.0.0.1:7400"
    data_dir = "var/publisher"          # publication logs and the registry
    source = "sqlite:///var/source.db"  # or postgresql://user@host:port/db

    [log]
    fsync = "always"                    # or "interval" (see docs/log.md)

    [[publication]]
    name = "shop"
    tables = ["accounts", "orders"]
    max_delta = 1000000                 # entries a subscriber may lag before it is invalid
    queue_threshold = 10000             # entries queued for an in-sync feed before it is cut
    send_timeout_s = 30.0
    heartbeat_s = 5.0

Operations (see docs/operations.md)::

    metrics_listen = "127.0.0.1:9464"   # Prometheus /metrics; "" disables
    allow_insecure_non_loopback = false # plaintext gRPC off loopback needs this

    [tls]
    cert_file = "tls/publisher.crt"
    key_file = "tls/publisher.key"
    client_ca_file = "tls/clients-ca.crt" # optional: require client certificates

    [auth]
    admin_token_hashes = ["sha256:..."]   # txrepl token hash

    [auth.publish.orders-app]             # a Publish token, granted per publication
    token_hash = "sha256:..."
    publications = ["shop"]               # or ["*"]

    [[subscriber]]
    name = "sub1"
    token_hash = "sha256:..."
    publications = ["shop"]               # or ["*"]
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Literal

from common.config import load_toml, parse_address
from common.dburl import DatabaseUrl
from common.names import parse_table
from common.origin import check_node
from common.security import ServerTls, check_hash, check_listen
from common.trace import check_every

__all__ = [
    "AuthConfig",
    "LogSettings",
    "PublicationConfig",
    "PublishGrant",
    "PublisherConfig",
    "QuerySnapshotConfig",
    "SubscriberGrant",
    "load_config",
]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}$")


def _check_name(what: str, value: str) -> None:
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} must start with a letter or _ and hold only letters, digits, _ . -"
        )


@dataclasses.dataclass(frozen=True)
class LogSettings:
    fsync: Literal["always", "interval"] = "always"
    fsync_interval_ms: int = 10
    segment_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.segment_bytes < 4096:
            raise ValueError(f"segment_bytes must be at least 4096, not {self.segment_bytes}")
        if self.fsync_interval_ms <= 0:
            raise ValueError("fsync_interval_ms must be positive")


@dataclasses.dataclass(frozen=True)
class QuerySnapshotConfig:
    """``[[publication.snapshot]]``: a query snapshot (publisher/querysnap.py)."""

    table: str  # the target table the result replaces
    query: str  # a SELECT over the source, in the source's SQL
    key: list[str] = dataclasses.field(default_factory=list)  # the result's key columns
    every_s: float = 0.0  # refresh period; 0: at start only

    def __post_init__(self) -> None:
        parse_table(self.table)
        if not self.query.strip():
            raise ValueError(f"snapshot {self.table!r}: query is empty")
        if not self.key:
            raise ValueError(
                f"snapshot {self.table!r}: key is empty: name the result's key columns"
            )
        if self.every_s < 0:
            raise ValueError(f"snapshot {self.table!r}: every_s must not be negative")


@dataclasses.dataclass(frozen=True)
class PublicationConfig:
    name: str
    tables: list[str] = dataclasses.field(default_factory=list)
    max_delta: int = 1_000_000
    queue_threshold: int = 10_000
    queue_threshold_bytes: int = 0  # 0: no byte limit
    send_timeout_s: float = 30.0
    heartbeat_s: float = 5.0
    batch_entries: int = 1000
    batch_bytes: int = 4 * 1024 * 1024
    retain_max_bytes: int = 0  # 0: no size limit (keep what valid subscribers need)
    retain_max_age_s: float = 0.0  # 0: no age limit
    # Publication-side shaping (publisher/shaping.py): per table, a row filter (an
    # SQLite expression over the source columns) and the published columns (the key
    # among them).  Rows and columns left out never reach the log or the wire.
    filter: dict[str, str] = dataclasses.field(default_factory=dict)
    columns: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    # Query snapshots (publisher/querysnap.py): tables replaced by a query's result.
    snapshot: list[QuerySnapshotConfig] = dataclasses.field(default_factory=list)
    # xDB's snapshot-only publication: ``tables`` are not captured; each refresh (at
    # start, every refresh_every_s if > 0, and on demand) carries their whole contents.
    snapshot_only: bool = False
    refresh_every_s: float = 0.0
    # Procedure calls captured at the source (publisher/capture/calls.py): the names
    # whose calls, made through common/calls.py, this publication carries in place of
    # their row changes.
    procedures: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        _check_name("publication name", self.name)
        for t in self.tables:
            parse_table(t)  # ValueError saying how to write it
        published = {str(parse_table(t)) for t in self.tables}
        for key in ("filter", "columns"):
            for t, v in getattr(self, key).items():
                if str(parse_table(t)) not in published:
                    raise ValueError(
                        f"{key}: table {t!r} is not in this publication's tables {self.tables}"
                    )
                if not v or (key == "filter" and not v.strip()):
                    raise ValueError(
                        f"{key}.{t}: empty; remove it to publish every "
                        + ("row" if key == "filter" else "column")
                    )
        if self.refresh_every_s < 0:
            raise ValueError("refresh_every_s must not be negative")
        for proc in self.procedures:
            if not proc or proc != proc.strip() or proc.count(".") > 1:
                raise ValueError(
                    f"procedures: {proc!r} is not a procedure name (name or schema.name, "
                    "as the application calls it)"
                )
        if self.refresh_every_s and not self.snapshot_only:
            raise ValueError("refresh_every_s is for snapshot_only publications: set both")
        snaps = [str(parse_table(q.table)) for q in self.snapshot]
        clash = sorted({t for t in snaps if t in published or snaps.count(t) > 1})
        if clash:
            raise ValueError(
                f"snapshot tables {clash} are also captured tables or repeated: one table, "
                "one source of rows"
            )
        for field in ("max_delta", "queue_threshold", "batch_entries", "batch_bytes"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, not {getattr(self, field)}")
        for field in ("send_timeout_s", "heartbeat_s"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, not {getattr(self, field)}")


@dataclasses.dataclass(frozen=True)
class PublishGrant:
    """``[auth.publish.<name>]``: one Publish token (hashed) and the publications it
    may append to."""

    token_hash: str
    publications: list[str]

    def __post_init__(self) -> None:
        check_hash(self.token_hash)
        if not self.publications:
            raise ValueError(
                'publications is empty: list the publications this token may publish to (["*"]'
                " for every one)"
            )
        for p in self.publications:
            if p != "*":
                _check_name("publication name", p)


@dataclasses.dataclass(frozen=True)
class AuthConfig:
    """Hashed credentials for the Admin service and the Publish RPC.

    ``publish``: Publish tokens by name, each granted its publications.  The older
    ``publish_token_hashes`` still works and grants every publication (as
    ``publications = ["*"]`` would); prefer ``[auth.publish.<name>]``.
    """

    admin_token_hashes: list[str] = dataclasses.field(default_factory=list)
    publish_token_hashes: list[str] = dataclasses.field(default_factory=list)
    publish: dict[str, PublishGrant] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for h in (*self.admin_token_hashes, *self.publish_token_hashes):
            check_hash(h)
        for name in self.publish:
            _check_name("auth.publish name", name)

    def publish_grants(self) -> list[tuple[str, str, tuple[str, ...]]]:
        """(token hash, grant name, publications) of every Publish token."""
        grants: list[tuple[str, str, tuple[str, ...]]]
        grants = [(h, "publish", ("*",)) for h in self.publish_token_hashes]
        grants += [(g.token_hash, n, tuple(g.publications)) for n, g in self.publish.items()]
        return grants


@dataclasses.dataclass(frozen=True)
class SubscriberGrant:
    """One subscriber allowed to sync: its token (hashed) and its publications."""

    name: str
    token_hash: str
    publications: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$", self.name):
            raise ValueError(f"subscriber name {self.name!r} is not a valid name")
        check_hash(self.token_hash)
        for p in self.publications:
            if p != "*":
                _check_name("publication name", p)


@dataclasses.dataclass(frozen=True)
class PublisherConfig:
    server_name: str
    source: str
    listen: str = "127.0.0.1:7400"
    data_dir: str = "var/publisher"
    poll_interval_ms: int = 5
    # Capture builds entries of at most this many bytes; a larger group of source
    # transactions is carried as several (common/fragments.py), a larger single row
    # is refused by name.
    max_entry_bytes: int = 4 * 1024 * 1024
    retention_interval_s: float = 30.0
    # PostgreSQL source, on-demand snapshots (docs/reinit.md): pieces read at a time,
    # and the size above which a table with a one-column integer key is read in key
    # ranges of about this many rows.
    snapshot_readers: int = 2
    snapshot_range_rows: int = 1_000_000
    slot: str = ""  # PostgreSQL source: replication slot name; default txrepl_<server_name>
    plugin: Literal["pgoutput", "wal2json"] = "pgoutput"  # PostgreSQL logical decoding plugin
    registry_url: str = ""  # SQLAlchemy URL; default sqlite:///<data_dir>/registry.db
    # The source's node name, recorded in it (txrepl_node) and carried as the origin of
    # its own changes (common/origin.py); default: the recorded one, else server_name.
    node: str = ""
    publication: list[PublicationConfig] = dataclasses.field(default_factory=list)
    log: LogSettings = dataclasses.field(default_factory=LogSettings)
    metrics_listen: str = "127.0.0.1:9464"
    allow_insecure_non_loopback: bool = False
    tls: ServerTls = dataclasses.field(default_factory=ServerTls)
    auth: AuthConfig = dataclasses.field(default_factory=AuthConfig)
    subscriber: list[SubscriberGrant] = dataclasses.field(default_factory=list)
    config_dir: str = "."
    # Debug (common/trace.py): trace the stages of every Nth seq into
    # <data_dir>/trace.jsonl (at exit and on SIGUSR2); 0: off.
    trace_every: int = 0

    def __post_init__(self) -> None:
        _check_name("server_name", self.server_name)
        check_every(self.trace_every)
        if self.node:
            check_node(self.node)
        parse_address(self.listen, field="listen")
        _ = self.source_url  # parsed (once) here: a ValueError names the field
        names = [p.name for p in self.publication]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(
                f"publication names must be unique; repeated: {', '.join(sorted(dup))}"
            )
        if self.registry_url:
            import sqlalchemy  # deferred (heavy): only to check an explicit registry_url

            try:
                sqlalchemy.engine.make_url(self.registry_url)
            except sqlalchemy.exc.ArgumentError:
                raise ValueError(
                    f"registry_url {self.registry_url!r} is not a SQLAlchemy URL"
                ) from None
        if self.poll_interval_ms <= 0:
            raise ValueError("poll_interval_ms must be positive")
        for key in ("snapshot_readers", "snapshot_range_rows"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be at least 1, not {getattr(self, key)}")
        if not 1024 <= self.max_entry_bytes <= 512 * 1024 * 1024:
            raise ValueError("max_entry_bytes must be between 1024 and 536870912 (512 MiB)")
        self._check_operations()

    def _check_operations(self) -> None:
        check_listen(
            self.listen,
            field="listen",
            tls=self.tls.enabled,
            allow_insecure=self.allow_insecure_non_loopback,
        )
        if self.metrics_listen:
            parse_address(self.metrics_listen, field="metrics_listen")
        for key in ("cert_file", "key_file", "client_ca_file"):
            value = getattr(self.tls, key)
            if value and not self.path(value).is_file():
                raise ValueError(f"tls.{key}: {str(self.path(value))!r} is not a readable file")
        names = [s.name for s in self.subscriber]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"subscriber names must be unique; repeated: {sorted(dup)}")
        published = {p.name for p in self.publication}
        for i, s in enumerate(self.subscriber):
            unknown = [p for p in s.publications if p != "*" and p not in published]
            if unknown:
                raise ValueError(f"subscriber[{i}].publications: unknown publication(s) {unknown}")
        for name, g in self.auth.publish.items():
            unknown = [p for p in g.publications if p != "*" and p not in published]
            if unknown:
                raise ValueError(
                    f"auth.publish.{name}.publications: unknown publication(s) {unknown} "
                    f"(known: {sorted(published)})"
                )
        if self.auth_enabled and not self.auth.admin_token_hashes:
            raise ValueError(
                "auth.admin_token_hashes: tokens are configured, so Admin calls need an admin "
                "token; add at least one (txrepl token generate)"
            )

    @property
    def auth_enabled(self) -> bool:
        """Any token configured: every call (publisher.service.AUTH_RULES) must carry one."""
        a = self.auth
        return bool(a.admin_token_hashes or a.publish_token_hashes or a.publish or self.subscriber)

    def path(self, value: str) -> Path:
        """Resolve a path from the config relative to the config file's directory."""
        p = Path(value)
        return p if p.is_absolute() else Path(self.config_dir) / p

    @property
    def slot_name(self) -> str:
        return self.slot or "txrepl_" + re.sub(r"[^a-z0-9_]", "_", self.server_name.lower())

    @property
    def data_path(self) -> Path:
        return self.path(self.data_dir)

    @functools.cached_property
    def source_url(self) -> DatabaseUrl:
        """``source`` parsed; a SQLite path is relative to the config file's directory."""
        return DatabaseUrl.parse(self.source, field="source", base_dir=self.config_dir)

    def find(self, publication: str) -> PublicationConfig | None:
        return next((p for p in self.publication if p.name == publication), None)


def load_config(path: str | Path) -> PublisherConfig:
    return load_toml(PublisherConfig, path)
