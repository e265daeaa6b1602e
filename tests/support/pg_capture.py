"""Helpers (no tests) for the PostgreSQL capture tests: real logs, a capture thread, readers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psycopg

from common.rpc import txrepl_pb2 as pb
from common.values import decode
from publisher.capture.postgres import Plugin, PostgresCapture
from publisher.config import PublicationConfig
from publisher.log import open_log
from publisher.publication import Publication


def open_pub(root: Path, name: str, tables: Sequence[str]) -> Publication:
    """A Publication on a real log under ``root/name``."""
    return Publication(
        PublicationConfig(name=name, tables=list(tables)), open_log(root / name, fsync="always")
    )


def read_entries(pub: Publication) -> list[pb.Entry]:
    out: list[pb.Entry] = []
    seq = pub.log.first_seq
    while seq <= pub.log.head:
        batch = pub.log.read(seq, max_entries=10_000)
        out.extend(pb.Entry.FromString(b) for b in batch)
        seq += len(batch)
    return out


def row_ops(entries: Sequence[pb.Entry]) -> list[tuple[str, str, list[object], list[object]]]:
    """(table, op name, decoded key, decoded row) of every row op, in log order."""
    out = []
    for e in entries:
        for op in e.ops:
            if op.WhichOneof("kind") == "row":
                rc = op.row
                out.append(
                    (
                        rc.table,
                        pb.RowOp.Name(rc.op).removeprefix("ROW_OP_"),
                        [decode(v) for v in rc.key],
                        [decode(v) for v in rc.row],
                    )
                )
    return out


def execute(dsn: str, *statements: str) -> None:
    """Run ``statements`` in ONE source transaction."""
    with psycopg.connect(dsn) as conn:
        for s in statements:
            conn.execute(s)


def wait_for(pred: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Running:
    """A capture running in a thread; ``error`` holds what run() raised."""

    def __init__(self, cap: PostgresCapture, pubs: Sequence[Publication]) -> None:
        self.cap = cap
        self.pubs = pubs
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.cap.run(self.pubs, self.halt)
        except BaseException as e:
            self.error = e

    def wait_heads(self, heads: dict[str, int], timeout: float = 20.0) -> None:
        by_name = {p.name: p for p in self.pubs}

        def done() -> bool:
            if self.error is not None:
                raise AssertionError(f"capture failed: {self.error!r}") from self.error
            return all(by_name[n].log.head >= h for n, h in heads.items())

        wait_for(done, timeout, f"heads {heads}")

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "capture did not stop"
        if self.error is not None:
            raise self.error


@contextmanager
def capturing(
    dsn: str,
    pubs: Sequence[Publication],
    *,
    slot: str = "txrepl_test",
    plugin: Plugin = "pgoutput",
    install: bool = True,
    **kwargs: object,
) -> Iterator[Running]:
    """Install every publication's tables and run capture until the block ends."""
    cap = PostgresCapture(dsn, slot=slot, plugin=plugin, **kwargs)  # type: ignore[arg-type]
    try:
        cap.check()
        if install:
            for p in pubs:
                cap.install(p.name, p.log.incarnation, p.config.tables)
        running = Running(cap, pubs)
        running.thread.start()
        if install:
            # Writes before the snapshot point land in the snapshot rows instead of
            # their own entries; tests that count entries start after it.
            running.wait_heads({p.name: len(p.config.tables) for p in pubs if p.log.head == 0})
        yield running
        running.stop()
    finally:
        cap.close()
