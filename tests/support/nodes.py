"""Nodes for topology tests: one database, its publisher and its subscriber, as real daemons.

A :class:`Node` is a database (SQLite file or PostgreSQL DSN) with, optionally, a
publisher daemon publishing ``shop`` from it (server and node name: the node's
name) and a subscriber daemon applying into it the ``shop`` publications of other
nodes: an updatable subscription, a pair or a chain is a few lines of these
(docs/topologies.md).
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.rpc import txrepl_pb2 as pb
from tests.support.harness import Daemon, publication_head, subscription_status, to_toml


@dataclass
class Node:
    name: str
    workdir: Path
    url: str  # sqlite:///... or postgresql://...
    tables: list[str]
    pub: Daemon | None = None
    sub: Daemon | None = None
    publisher_extra: dict[str, Any] = field(default_factory=dict)
    subscription_extra: dict[str, Any] = field(default_factory=dict)  # each subscription's

    def start_publisher(self) -> Daemon:
        cfg = {
            "server_name": self.name,
            "listen": "127.0.0.1:0",
            "data_dir": str(self.workdir / "publisher"),
            "source": self.url,
            "poll_interval_ms": 2,
            **self.publisher_extra,
            "publication": [{"name": "shop", "tables": self.tables}],
        }
        path = self.workdir / "publisher.toml"
        path.write_text(to_toml(cfg))
        self.pub = Daemon(
            "publisher", path, self.workdir / "publisher" / "publisher.addr",
            self.workdir / "publisher.log",
        ).start()  # fmt: skip
        return self.pub

    def start_subscriber(self, upstream: Sequence[Node]) -> Daemon:
        """A subscriber applying the ``shop`` publication of each of ``upstream`` here."""
        subs = []
        for up in upstream:
            assert up.pub is not None
            subs.append({
                "publisher": up.name, "address": up.pub.address, "publication": "shop",
                **self.subscription_extra,
            })  # fmt: skip
        cfg = {
            "server_name": f"{self.name}-sub",
            "target": self.url,
            "control_listen": "127.0.0.1:0",
            "data_dir": str(self.workdir / "subscriber"),
            "backoff": {"initial_s": 0.1, "max_s": 1.0},
            "subscription": subs,
        }
        path = self.workdir / "subscriber.toml"
        path.write_text(to_toml(cfg))
        self.sub = Daemon(
            "subscriber", path, self.workdir / "subscriber" / "subscriber.addr",
            self.workdir / "subscriber.log",
        ).start()  # fmt: skip
        return self.sub

    def head(self) -> int:
        assert self.pub is not None
        return publication_head(self.pub.address, "shop")

    def levels(self) -> dict[str, tuple[int, str]]:
        """subscription -> (level, state)."""
        assert self.sub is not None
        return {s.name: (s.level, s.state) for s in subscription_status(self.sub.address)}

    def stop(self) -> None:
        for d in (self.sub, self.pub):
            if d is not None:
                d.stop()

    def logged(self) -> list[pb.Entry]:
        """Every entry of this node's ``shop`` log (the publisher stopped)."""
        from publisher.log import open_log

        log = open_log(self.workdir / "publisher" / "publications" / "shop", create=False)
        try:
            out: list[pb.Entry] = []
            while len(out) < log.head:
                out.extend(pb.Entry.FromString(p) for p in log.read(len(out) + 1))
            return out
        finally:
            log.close()


_CHANGES = (pb.ROW_OP_INSERT, pb.ROW_OP_UPDATE, pb.ROW_OP_DELETE)


def row_ops_by_origin(entries: Sequence[pb.Entry]) -> Counter[str]:
    """Row changes (inserts, updates, deletes; not an install's truncate) per origin."""
    return Counter(
        e.origin for e in entries for op in e.ops if op.HasField("row") and op.row.op in _CHANGES
    )


def caught_up(nodes: Sequence[Node]) -> bool:
    """Every subscription in sync at its publisher's head."""
    heads = {n.name: n.head() for n in nodes if n.pub is not None}
    for n in nodes:
        if n.sub is None:
            continue
        for name, (level, state) in n.levels().items():
            if state != "in_sync" or level != heads[name.split(".")[0]]:
                return False
    return True


def sqlite_rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
