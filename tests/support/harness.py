"""Real daemons as real processes, for the demo, integration, chaos tests and benchmarks.

Each daemon runs as ``python -m publisher|subscriber run --config FILE`` with
port 0; the bound address is read back from the ``*.addr`` file it writes once
it is ready.  Helpers poll the publisher's Admin and the subscriber's control
service over loopback gRPC.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc

ROOT = Path(__file__).resolve().parents[2]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(data: dict[str, Any]) -> str:
    """A tiny TOML writer for our configs (scalars, tables, arrays of tables)."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for k, v in data.items():
        if isinstance(v, dict) or (isinstance(v, list) and v and isinstance(v[0], dict)):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    for k, v in tables:
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
        else:
            for item in v:
                lines.append(f"\n[[{k}]]")
                lines.extend(f"{kk} = {_toml_value(vv)}" for kk, vv in item.items())
    return "\n".join(lines) + "\n"


def txrepl_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``txrepl ARGS...`` (this interpreter's ``-m common.cli``) from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "common.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(cond: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Daemon:
    kind: str  # "publisher" | "subscriber"
    config_path: Path
    addr_file: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    # The command before ``run --config FILE`` (default: this interpreter's ``-m KIND``),
    # e.g. ``[venv/bin/txrepl, "publisher"]`` for another installation.
    command: list[str] = field(default_factory=list)
    cwd: Path = ROOT

    def start(self, timeout: float = 90.0) -> Daemon:
        if self.addr_file.exists():
            self.addr_file.unlink()
        env = dict(os.environ)
        # Metrics on a free port (the defaults are fixed ports); see metrics_address.
        env.setdefault("TXREPL_METRICS_LISTEN", "127.0.0.1:0")
        env.update(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        command = self.command or [sys.executable, "-m", self.kind]
        self.proc = subprocess.Popen(
            [*command, "run", "--config", str(self.config_path)],
            cwd=self.cwd,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        logf.close()

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.kind} exited with {self.proc.returncode} during start-up; "
                    f"log {self.log_path}:\n{self.tail()}"
                )
            return self.addr_file.exists() and bool(self.addr_file.read_text().strip())

        wait_until(ready, timeout, f"{self.kind} to be ready")
        self.address = self.addr_file.read_text().strip()
        return self

    @property
    def metrics_address(self) -> str:
        """host:port of the /metrics endpoint (written next to the addr file)."""
        return (self.addr_file.parent / "metrics.addr").read_text().strip()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean-up, no drain."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait for a graceful exit; SIGKILL if it takes too long."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode


def publisher_admin(address: str) -> rpc.AdminStub:
    return rpc.AdminStub(grpc.insecure_channel(address))


def subscriber_control(address: str) -> rpc.SubscriberControlStub:
    return rpc.SubscriberControlStub(grpc.insecure_channel(address))


def publication_head(address: str, publication: str) -> int:
    with grpc.insecure_channel(address) as ch:
        resp = rpc.AdminStub(ch).ListPublications(pb.ListPublicationsRequest(), timeout=10)
    for p in resp.publications:
        if p.name == publication:
            return int(p.head)
    raise KeyError(publication)


def subscription_status(address: str) -> list[pb.SubscriptionStatus]:
    with grpc.insecure_channel(address) as ch:
        resp = rpc.SubscriberControlStub(ch).Status(pb.StatusRequest(), timeout=10)
    return list(resp.subscriptions)


@dataclass
class Pair:
    """A publisher and a subscriber on SQLite files under one directory."""

    workdir: Path
    tables: list[str]
    publication: str = "shop"
    publisher_name: str = "pub1"
    subscriber_name: str = "sub1"
    publisher_extra: dict[str, Any] = field(default_factory=dict)
    publication_extra: dict[str, Any] = field(default_factory=dict)
    subscriber_extra: dict[str, Any] = field(default_factory=dict)
    subscription_extra: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    source_url: str = ""  # default: SQLite file source.db
    target_url: str = ""  # default: SQLite file target.db
    pub: Daemon | None = None
    sub: Daemon | None = None

    @property
    def source_path(self) -> Path:
        return self.workdir / "source.db"

    @property
    def target_path(self) -> Path:
        return self.workdir / "target.db"

    def write_publisher_config(self, listen: str = "127.0.0.1:0") -> Path:
        cfg: dict[str, Any] = {
            "server_name": self.publisher_name,
            "listen": listen,
            "data_dir": str(self.workdir / "publisher"),
            "source": self.source_url or f"sqlite:///{self.source_path}",
            "poll_interval_ms": 2,
            **self.publisher_extra,
            "publication": [
                {"name": self.publication, "tables": self.tables, **self.publication_extra}
            ],
        }
        path = self.workdir / "publisher.toml"
        path.write_text(to_toml(cfg))
        return path

    def reinit_argv(self, subscription: str = "pub1.shop") -> list[str]:
        """``txrepl subscriber reinit SUBSCRIPTION`` against this pair's subscriber config."""
        config = self.workdir / "subscriber.toml"
        return [sys.executable, "-m", "common.cli", "subscriber", "reinit", subscription,
                "--config", str(config)]  # fmt: skip

    def write_subscriber_config(self, publisher_address: str) -> Path:
        cfg: dict[str, Any] = {
            "server_name": self.subscriber_name,
            "target": self.target_url or f"sqlite:///{self.target_path}",
            "control_listen": "127.0.0.1:0",
            "data_dir": str(self.workdir / "subscriber"),
            **self.subscriber_extra,
            "backoff": {"initial_s": 0.1, "max_s": 1.0},
            "subscription": [
                {
                    "publisher": self.publisher_name,
                    "address": publisher_address,
                    "publication": self.publication,
                    **self.subscription_extra,
                }
            ],
        }
        path = self.workdir / "subscriber.toml"
        path.write_text(to_toml(cfg))
        return path

    def publisher_daemon(self, listen: str = "127.0.0.1:0") -> Daemon:
        """This pair's publisher, configured, not started (``start_publisher`` starts it)."""
        return Daemon(
            "publisher",
            self.write_publisher_config(listen),
            self.workdir / "publisher" / "publisher.addr",
            self.workdir / "publisher.log",
            env=self.env,
        )

    def start_publisher(self, listen: str = "127.0.0.1:0") -> Daemon:
        self.pub = self.publisher_daemon(listen).start()
        return self.pub

    def subscriber_daemon(self) -> Daemon:
        """This pair's subscriber (of the running publisher), configured, not started."""
        assert self.pub is not None
        return Daemon(
            "subscriber",
            self.write_subscriber_config(self.pub.address),
            self.workdir / "subscriber" / "subscriber.addr",
            self.workdir / "subscriber.log",
            env=self.env,
        )

    def start_subscriber(self) -> Daemon:
        self.sub = self.subscriber_daemon().start()
        return self.sub

    def load_snapshot(self, target: str | Path, **more: Any) -> int:
        """Load this publication's snapshot into ``target`` in this process
        (subscriber/targets, as ``sub1``); returns the snapshot's seq."""
        from subscriber.targets import load_snapshot

        assert self.pub is not None
        return load_snapshot(
            address=self.pub.address,
            publisher=self.publisher_name,
            publication=self.publication,
            subscriber=self.subscriber_name,
            subscription=f"{self.publisher_name}.{self.publication}",
            target=target,
            **more,
        )[1]

    def head(self) -> int:
        assert self.pub is not None
        return publication_head(self.pub.address, self.publication)

    def status_publications(self) -> dict[str, pb.PublicationInfo]:
        assert self.pub is not None
        with grpc.insecure_channel(self.pub.address) as ch:
            resp = rpc.AdminStub(ch).ListPublications(pb.ListPublicationsRequest(), timeout=10)
        return {p.name: p for p in resp.publications}

    def status(self) -> pb.SubscriptionStatus:
        assert self.sub is not None
        (st,) = subscription_status(self.sub.address)
        return st

    def wait_caught_up(self, timeout: float = 120.0) -> int:
        """Wait until the subscriber's level equals the head and the state is in_sync."""
        head = self.head()

        def done() -> bool:
            nonlocal head
            head = self.head()
            st = self.status()
            return st.level == head and st.state == "in_sync"

        wait_until(done, timeout, "the subscriber to catch up", interval=0.1)
        return head

    def stop(self) -> None:
        for d in (self.sub, self.pub):
            if d is not None:
                d.stop()


def publisher_start_fails(pair: Pair, *, first: bool = True) -> str:
    """Run ``txrepl publisher run`` on ``pair``'s config, expecting a refusal: it exits
    non-zero (a ``first`` start having written no data directory); returns its one
    stderr line."""
    cfg = pair.write_publisher_config()
    proc = subprocess.run(
        [sys.executable, "-m", "common.cli", "publisher", "run", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert not first or not (pair.workdir / "publisher").exists()  # nothing written
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def admin_cli(pair: Pair, *args: str) -> subprocess.CompletedProcess[str]:
    """``txrepl admin --publisher <pair's publisher> ARGS...``, its output captured."""
    assert pair.pub is not None
    argv = [sys.executable, "-m", "common.cli", "admin", "--publisher", pair.pub.address]
    return subprocess.run(
        [*argv, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def synced(pair: Pair, before: Any = None) -> Any:
    """A raw Sync client (tests/support/feedclient.py) caught up with ``pair``'s head,
    resuming ``before``'s level, incarnation and target when given."""
    import asyncio

    from tests.support.feedclient import RawSubscriber

    assert pair.pub is not None
    address = pair.pub.address

    async def run() -> RawSubscriber:
        sub = RawSubscriber(address, "sub1")
        if before is not None:
            sub.level, sub.incarnation, sub.target = before.level, before.incarnation, before.target
        await sub.start()
        try:
            await sub.wait_level(pair.head(), timeout=20)
        finally:
            await sub.close()
        return sub

    return asyncio.run(run())
