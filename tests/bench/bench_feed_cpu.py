"""CPU per entry of a publisher's in-sync feed path (issue 23).

A publication log (``fsync="always"``), a registry (SQLite), the real FeedManager
behind a real gRPC server on port 0 in this process, and a raw subscriber that
acknowledges every batch in a child process (``python -m
tests.bench.bench_feed_cpu ADDRESS``), so the publisher's CPU is measured apart
from the subscriber's.  Entries are appended one at a time by one thread (as
capture would), each once the previous one was acknowledged (the thread waits on a
``threading.Event``: the event loop pays no hop per entry for the bench's driver):
the in-sync case at its worst, one entry per batch and one ack each.  The figures,
over ``TXREPL_BENCH_FEED_N`` entries (default 3,000), are CPU µs (user + system) per
entry: the publisher process (append and fsync, the feed's wait, read and send,
the ack's receipt), its event loop's thread alone, and the subscriber process
(``/proc/<pid>/stat``).  A fixed amount of work, so it holds better than a lag
phase's CPU on a shared machine (docs/performance.md, "Publisher CPU per
transaction").

    python -m tests.bench feed_cpu
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common.client import insert_op
from common.rpc import txrepl_pb2 as pb
from publisher.registry import Registry
from tests.bench._cpu import process_cpu_s
from tests.support.feedclient import RawSubscriber
from tests.support.feedserver import served_feeds

__all__ = ["run"]

WARM_UP = 200
ROOT = Path(__file__).resolve().parents[2]


def _threads_cpu_s() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by name (Python threads by
    their name, digits dropped: ``asyncio_3`` counts as ``asyncio_``; others by the
    kernel's)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        cpu = process_cpu_s(0, f"self/task/{task.name}")
        if cpu is None:
            continue
        tid = int(task.name)
        name = names.get(tid) or Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        name = name.rstrip("0123456789") if "_" in name else name
        out[name] = out.get(name, 0.0) + cpu
    return out


def _cpu(pid: int) -> float:
    cpu = process_cpu_s(pid)
    if cpu is None:
        raise RuntimeError(f"no CPU figure for process {pid} (/proc/{pid}/stat)")
    return cpu


async def _measure(root: Path, n: int) -> dict[str, Any]:
    async with served_feeds(root, Registry) as served:
        pub = served.pub
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.bench.bench_feed_cpu", served.address, cwd=ROOT
        )
        try:
            deadline = time.monotonic() + 120
            while not any(f.state == "in_sync" for f in served.feeds.feeds):
                if time.monotonic() > deadline or child.returncode is not None:
                    raise RuntimeError("the subscriber process did not reach in sync")
                await asyncio.sleep(0.01)
            (feed,) = served.feeds.feeds
            acked = threading.Event()
            acknowledge = feed.acknowledge

            def noted(level: int) -> None:
                acknowledge(level)
                acked.set()

            setattr(feed, "acknowledge", noted)  # noqa: B010 (the bench's probe)

            def drive(start: int, stop: int) -> None:
                """Append entries one at a time, each once the previous was acked."""
                for i in range(start, stop):
                    acked.clear()
                    seq = pub.append(pb.Entry(ops=[insert_op("notes", [i, "x"])]))
                    while feed.acked < seq:
                        if not acked.wait(60):
                            raise RuntimeError(f"entry {seq} not acknowledged within 60 s")
                        acked.clear()

            me = os.getpid()
            await asyncio.to_thread(drive, 0, WARM_UP)
            pub_cpu, sub_cpu, threads = _cpu(me), _cpu(child.pid), _threads_cpu_s()
            loop_cpu, wall = time.thread_time(), time.perf_counter()
            await asyncio.to_thread(drive, WARM_UP, WARM_UP + n)
            loop_cpu = time.thread_time() - loop_cpu
            wall = time.perf_counter() - wall
            pub_after, sub_after = _cpu(me), _cpu(child.pid)
            by_thread = {
                k: round((v - threads.get(k, 0.0)) / n * 1e6, 1)
                for k, v in _threads_cpu_s().items()
            }
        finally:
            served.feeds.stopping.set()
            try:
                await asyncio.wait_for(child.wait(), 30)
            except TimeoutError:
                child.kill()
                await child.wait()

    def per_entry(s: float) -> float:
        return round(s / n * 1e6, 1)

    return {
        "bench": "feed_cpu",
        "entries": n,
        "publisher_cpu_us_per_entry": per_entry(pub_after - pub_cpu),
        "publisher_loop_cpu_us_per_entry": per_entry(loop_cpu),
        "subscriber_cpu_us_per_entry": per_entry(sub_after - sub_cpu),
        "wall_us_per_entry": per_entry(wall),
        "publisher_threads_cpu_us_per_entry": dict(sorted(by_thread.items())),
    }


async def _subscribe(address: str) -> None:
    """The child: a raw subscriber that acks every batch until the stream ends."""
    sub = await RawSubscriber(address, "s1").start()
    try:
        await sub.ended.wait()
    finally:
        await sub.close()


def run(results_dir: Path) -> list[dict[str, Any]]:
    value = os.environ.get("TXREPL_BENCH_FEED_N", "")
    n = int(value) if value.strip() else 3000
    with tempfile.TemporaryDirectory(prefix="txrepl-bench-feed-") as tmp:
        row = asyncio.run(_measure(Path(tmp), n))
    print(
        f"feed path, in sync, one entry per batch, {n} entries, CPU µs per entry: "
        f"publisher {row['publisher_cpu_us_per_entry']:.0f} (its event loop "
        f"{row['publisher_loop_cpu_us_per_entry']:.0f}), subscriber "
        f"{row['subscriber_cpu_us_per_entry']:.0f}; {row['wall_us_per_entry']:.0f} µs wall\n"
        f"  publisher's threads: {row['publisher_threads_cpu_us_per_entry']}"
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "bench_feed_cpu.json").write_text(json.dumps(row) + "\n")
    return [row]


if __name__ == "__main__":
    threading.current_thread().name = "subscriber"
    asyncio.run(_subscribe(sys.argv[1]))
