"""Publisher configuration (``publisher.toml``), frozen and validated at start.

Example::

    server_name = "pub1"
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
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Literal

from common.config import load_toml, parse_address

__all__ = ["LogSettings", "PublicationConfig", "PublisherConfig", "load_config"]

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
class PublicationConfig:
    name: str
    tables: list[str] = dataclasses.field(default_factory=list)
    max_delta: int = 1_000_000
    queue_threshold: int = 10_000
    send_timeout_s: float = 30.0
    heartbeat_s: float = 5.0
    batch_entries: int = 1000
    batch_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        _check_name("publication name", self.name)
        for t in self.tables:
            if not t or '"' in t:
                raise ValueError(f"table name {t!r} is not usable")
        for field in ("max_delta", "queue_threshold", "batch_entries", "batch_bytes"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, not {getattr(self, field)}")
        for field in ("send_timeout_s", "heartbeat_s"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, not {getattr(self, field)}")


@dataclasses.dataclass(frozen=True)
class PublisherConfig:
    server_name: str
    source: str
    listen: str = "127.0.0.1:7400"
    data_dir: str = "var/publisher"
    poll_interval_ms: int = 5
    publication: list[PublicationConfig] = dataclasses.field(default_factory=list)
    log: LogSettings = dataclasses.field(default_factory=LogSettings)
    config_dir: str = "."

    def __post_init__(self) -> None:
        _check_name("server_name", self.server_name)
        parse_address(self.listen, field="listen")
        if not (self.source.startswith("sqlite:///") or self.source.startswith("postgresql")):
            raise ValueError(
                f"source {self.source!r}: use sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
            )
        names = [p.name for p in self.publication]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(
                f"publication names must be unique; repeated: {', '.join(sorted(dup))}"
            )
        if self.poll_interval_ms <= 0:
            raise ValueError("poll_interval_ms must be positive")

    def path(self, value: str) -> Path:
        """Resolve a path from the config relative to the config file's directory."""
        p = Path(value)
        return p if p.is_absolute() else Path(self.config_dir) / p

    @property
    def data_path(self) -> Path:
        return self.path(self.data_dir)

    @property
    def sqlite_source_path(self) -> Path:
        assert self.source.startswith("sqlite:///")
        return self.path(self.source[len("sqlite:///") :])

    def find(self, publication: str) -> PublicationConfig | None:
        return next((p for p in self.publication if p.name == publication), None)


def load_config(path: str | Path) -> PublisherConfig:
    return load_toml(PublisherConfig, path)
