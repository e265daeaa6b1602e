"""CPU per entry of a publisher's in-sync feed path, in one process (issue 23).

A publication log (``fsync="always"``), a registry (SQLite), the real FeedManager
behind a real gRPC server on port 0, and a raw subscriber that acknowledges every
batch.  Entries are appended one at a time, each once the previous one was applied
and acknowledged: the in-sync case at its worst (one entry per batch, one ack each).
The figure is the process's CPU seconds (user + system) per entry over
``TXREPL_BENCH_FEED_N`` entries (default 3,000): append and fsync, the feed's wait,
read and send, the subscriber's receipt and ack, the feed's handling of the ack.
A fixed amount of work, so it holds better than a lag phase's CPU on a shared
machine (docs/performance.md, "Publisher CPU per transaction").

    python -m tests.bench feed_cpu
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from common.client import insert_op
from common.rpc import txrepl_pb2 as pb
from publisher.registry import Registry
from tests.support.feedclient import RawSubscriber
from tests.support.feedserver import served_feeds

__all__ = ["run"]

WARM_UP = 200


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _measure(root: Path, n: int) -> dict[str, Any]:
    async with served_feeds(root, Registry) as served:
        pub = served.pub
        sub = await RawSubscriber(served.address, "s1").start()
        try:
            await asyncio.wait_for(sub.in_sync.wait(), 60)
            cpu = wall = 0.0
            for i in range(WARM_UP + n):
                if i == WARM_UP:
                    cpu, wall = _cpu_s(), time.perf_counter()
                sub.acked.clear()
                entry = pb.Entry(ops=[insert_op("notes", [i, "x"])])
                await asyncio.to_thread(pub.append, entry)
                while sub.level < pub.log.head:
                    await asyncio.wait_for(sub.acked.wait(), 60)
                    sub.acked.clear()
            cpu, wall = _cpu_s() - cpu, time.perf_counter() - wall
        finally:
            await sub.close()
    return {
        "bench": "feed_cpu",
        "entries": n,
        "cpu_us_per_entry": round(cpu / n * 1e6, 1),
        "wall_us_per_entry": round(wall / n * 1e6, 1),
    }


def run(results_dir: Path) -> list[dict[str, Any]]:
    value = os.environ.get("TXREPL_BENCH_FEED_N", "")
    n = int(value) if value.strip() else 3000
    with tempfile.TemporaryDirectory(prefix="txrepl-bench-feed-") as tmp:
        row = asyncio.run(_measure(Path(tmp), n))
    print(
        f"feed path, in sync, one entry per batch: {row['cpu_us_per_entry']:.0f} µs of CPU "
        f"per entry ({row['wall_us_per_entry']:.0f} µs wall), {n} entries"
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "bench_feed_cpu.json").write_text(json.dumps(row) + "\n")
    return [row]
