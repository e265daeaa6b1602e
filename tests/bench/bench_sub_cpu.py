"""CPU per entry of a subscriber daemon in sync, one entry per batch (issue 23).

The publisher's side runs in this process (a publication log, a registry, the real
FeedManager behind a real gRPC server on port 0); the subscriber is a real daemon
(``python -m subscriber run``), applying into a SQLite file or a private PostgreSQL
cluster.  W1-shaped entries (``tests/support/w1_entries.py``: an order inserted, its
account updated, sometimes an order shipped or deleted) are appended one at a time,
each once the subscriber acknowledged the one before: the in-sync case at its worst
(one entry per batch, one target transaction and one ack each).  The figure is the
subscriber process's CPU seconds (user + system, ``/proc/<pid>/stat``) per entry over
``TXREPL_BENCH_SUB_N`` entries (default 2,000) after a warm-up, and for PostgreSQL
the CPU of the writer's server process beside it.  A fixed amount of work, so it
holds better than a lag phase's CPU on a shared machine (docs/performance.md,
"Subscriber CPU per transaction").

    python -m tests.bench sub_cpu                    # both targets
    TXREPL_BENCH_SUB_TARGETS=sqlite python -m tests.bench sub_cpu
    TXREPL_BENCH_SUB_PROFILE=<path of py-spy>        # also record the subscriber
    TXREPL_BENCH_SUB_RATE=1000 python -m tests.bench sub_cpu

``TXREPL_BENCH_SUB_ACK_MS`` sets the subscriber's ``[batch] ack_interval_ms``: one
entry at a time waits for each ack, so with coalesced acks (the default, 5 ms) each
entry waits for the interval; 0 measures that mode as before acks were coalesced.

``TXREPL_BENCH_SUB_RATE`` (entries per second): the measured entries are appended
at that pace instead of each after the previous ack, as a source in sync would
commit them, so batches and acks form as they do in a W1 lag phase (natural
batching, coalesced acks); the figure is then the CPU from the first append to the
ack of the last entry, per entry, and the row also gives batches... no: the acks
the publisher received per entry (``acks_per_entry``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.rpc import txrepl_pb2 as pb
from publisher import feed as feed_module
from publisher.registry import Registry
from tests.bench._cpu import process_cpu_s, py_spy
from tests.support.feedserver import ServedFeeds, served_feeds
from tests.support.harness import Daemon, Pair
from tests.support.w1_entries import W1_SCHEMAS, w1_entries

__all__ = ["run"]

WARM_UP = 300
IDLE_S = 2.0


@contextlib.contextmanager
def _acks() -> Iterator[dict[str, Any]]:
    """The feed's acknowledged levels as they arrive (the bench waits on them)."""
    seen: dict[str, Any] = {"level": 0, "event": asyncio.Event(), "count": 0}
    original = feed_module.Feed.acknowledge

    def acknowledge(self: feed_module.Feed, level: int) -> None:
        original(self, level)
        seen["level"] = level
        seen["count"] += 1
        seen["event"].set()

    feed_module.Feed.acknowledge = acknowledge  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        feed_module.Feed.acknowledge = original  # type: ignore[method-assign]


def _user_sys(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` so far."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _batches(log: Path) -> int:
    """Batches the subscriber logged as applied so far."""
    try:
        return log.read_text(errors="replace").count("batch applied")
    except OSError:
        return 0


def _backend_pid(dsn: str) -> int | None:
    """The server process of the subscriber's writer (application_name)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'txrepl-subscriber'"
            " AND datname = current_database() ORDER BY backend_start DESC LIMIT 1"
        ).fetchone()
    return int(row[0]) if row else None


async def _measure(
    root: Path, kind: str, target: str, n: int, spy: str, rate: float
) -> dict[str, Any]:
    async with served_feeds(root, Registry, W1_SCHEMAS) as served:
        return await _measure_served(root, kind, target, n, spy, served, rate)


def _paced(pub: Any, entries: list[pb.Entry], rate: float) -> None:
    """Append ``entries`` at ``rate`` per second (a thread: the feeds run on the loop)."""
    start = time.perf_counter()
    for i, entry in enumerate(entries):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        pub.append(entry)


async def _measure_served(
    root: Path,
    kind: str,
    target: str,
    n: int,
    spy: str,
    served: ServedFeeds[Registry],
    rate: float = 0.0,
) -> dict[str, Any]:
    pub = served.pub
    # The first entry inserts W1's 10,000 accounts: applied in the driver too, so that
    # no JVM starts beside the measure (it is the subscriber's child process).
    extra: dict[str, Any] = {"apply": {"spark_min_rows": 1_000_000}}
    ack_ms = os.environ.get("TXREPL_BENCH_SUB_ACK_MS", "").strip()
    if ack_ms:  # [batch] ack_interval_ms (subscriber/stream.py); unset: the default
        extra["batch"] = {"ack_interval_ms": int(ack_ms)}
    pair = Pair(root, tables=["accounts", "orders"], target_url=target, subscriber_extra=extra)
    sub = Daemon(
        "subscriber",
        pair.write_subscriber_config(served.address),
        root / "subscriber" / "subscriber.addr",
        root / "subscriber.log",
    )
    entries = w1_entries(WARM_UP + n + 1)
    try:
        with _acks() as seen:
            await asyncio.to_thread(sub.start)
            assert sub.proc is not None
            pid = sub.proc.pid

            async def one(entry: pb.Entry) -> None:
                seen["event"].clear()
                await asyncio.to_thread(pub.append, entry)
                head = pub.log.head
                while seen["level"] < head:
                    await asyncio.wait_for(seen["event"].wait(), 120)
                    seen["event"].clear()

            for entry in entries[: WARM_UP + 1]:
                await one(entry)
            backend = _backend_pid(target) if kind == "pg" else None
            # In sync and idle: what the daemon costs while nothing comes (its timers,
            # gRPC's pollers), which a slow measure also pays for its wall time.
            idle0 = process_cpu_s(pid)
            await asyncio.sleep(IDLE_S)
            idle1 = process_cpu_s(pid)
            cpu0, bcpu0 = process_cpu_s(pid), process_cpu_s(backend) if backend else None
            us0 = _user_sys(pid)
            # The main thread runs the event loop (its task id is the process's).
            loop0 = process_cpu_s(pid, f"{pid}/task/{pid}")
            wall = time.perf_counter()
            acks0 = seen["count"]
            batches0 = _batches(root / "subscriber.log")
            with py_spy(spy or None, pid, root.parent / f"sub_cpu_{kind}.raw"):
                if rate > 0:
                    await asyncio.to_thread(_paced, pub, entries[WARM_UP + 1 :], rate)
                    head = pub.log.head
                    while seen["level"] < head:
                        seen["event"].clear()
                        await asyncio.wait_for(seen["event"].wait(), 120)
                else:
                    for entry in entries[WARM_UP + 1 :]:
                        await one(entry)
            wall = time.perf_counter() - wall
            acks = seen["count"] - acks0
            batches = _batches(root / "subscriber.log") - batches0
            cpu1, bcpu1 = process_cpu_s(pid), process_cpu_s(backend) if backend else None
            us1 = _user_sys(pid)
            loop1 = process_cpu_s(pid, f"{pid}/task/{pid}")
    finally:
        sub.stop()
    assert cpu0 is not None
    assert cpu1 is not None
    row: dict[str, Any] = {
        "target": kind,
        "entries": n,
        "cpu_us_per_entry": round((cpu1 - cpu0) / n * 1e6, 1),
        "wall_us_per_entry": round(wall / n * 1e6, 1),
        "user_us_per_entry": round((us1[0] - us0[0]) / n * 1e6, 1),
        "sys_us_per_entry": round((us1[1] - us0[1]) / n * 1e6, 1),
        "loop_us_per_entry": (
            round((loop1 - loop0) / n * 1e6, 1) if loop0 is not None and loop1 is not None else None
        ),
        "idle_cpu_percent": (
            round((idle1 - idle0) / IDLE_S * 100, 2)
            if idle0 is not None and idle1 is not None
            else None
        ),
        "rate": rate,
        "acks_per_entry": round(acks / n, 3),
        # applied batches (the daemon's "batch applied" lines); CPU per batch is the
        # figure that does not move with the batch sizes a paced run happens to get
        "batches_per_entry": round(batches / n, 3),
        "cpu_us_per_batch": round((cpu1 - cpu0) / max(batches, 1) * 1e6, 1),
    }
    if bcpu0 is not None and bcpu1 is not None:
        row["server_cpu_us_per_entry"] = round((bcpu1 - bcpu0) / n * 1e6, 1)
    return row


def run(results_dir: Path) -> list[dict[str, Any]]:
    value = os.environ.get("TXREPL_BENCH_SUB_N", "")
    n = int(value) if value.strip() else 2000
    kinds = os.environ.get("TXREPL_BENCH_SUB_TARGETS", "sqlite,pg").split(",")
    spy = os.environ.get("TXREPL_BENCH_SUB_PROFILE", "")
    rate = float(os.environ.get("TXREPL_BENCH_SUB_RATE", "") or 0)
    results_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for kind in (k.strip() for k in kinds if k.strip()):
        with tempfile.TemporaryDirectory(prefix="txrepl-bench-sub-") as tmp:
            root = Path(tmp) / "w"
            root.mkdir()
            if kind == "pg":
                from tests.bench._pg import bench_cluster

                with bench_cluster() as server:
                    dsn = server.create_database("subcpu")
                    row = asyncio.run(_measure(root, kind, dsn, n, spy, rate))
            else:
                row = asyncio.run(
                    _measure(root, kind, f"sqlite:///{root / 'target.db'}", n, spy, rate)
                )
            if spy:
                for suffix in ("", ".threads"):
                    src = Path(tmp) / f"sub_cpu_{kind}.raw{suffix}"
                    if src.exists():
                        (results_dir / src.name).write_bytes(src.read_bytes())
        server_part = (
            f", PostgreSQL's writer process {row['server_cpu_us_per_entry']:.0f} µs"
            if "server_cpu_us_per_entry" in row
            else ""
        )
        shape = f"W1 entries at {rate:g}/s" if rate > 0 else "one W1 entry per batch"
        print(
            f"subscriber in sync, {kind} target, {shape}: "
            f"{row['cpu_us_per_entry']:.0f} µs of CPU per entry "
            f"(user {row['user_us_per_entry']:.0f}, system {row['sys_us_per_entry']:.0f}, "
            f"event loop {row['loop_us_per_entry'] or 0:.0f})"
            f"{server_part} "
            f"({row['wall_us_per_entry']:.0f} µs wall), {n} entries, "
            f"{row['acks_per_entry']:.2f} acks and {row['batches_per_entry']:.2f} batches per "
            f"entry, {row['cpu_us_per_batch']:.0f} µs of CPU per batch; idle in sync "
            f"{row['idle_cpu_percent'] or 0:.1f} % of a core",
            flush=True,
        )
        rows.append(row)
    (results_dir / "bench_sub_cpu.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows
