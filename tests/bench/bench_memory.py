"""Memory: publisher RSS against log size, subscriber RSS against batch size.

Publisher: a publication log of 1M and 10M entries (``TXREPL_BENCH_MEM_SIZES``) is
built directly with ``publisher.log.open_log(...).append`` in batches of 10,000
W1-sized entries; a publisher is started on it and one raw client (tests/support/feedclient.py,
counting only) syncs through the whole log while /proc/<pid>/status VmRSS is sampled
every 0.25 s.  RSS should not grow with the log: entries are streamed from the
segments, not held.

Subscriber: the real subscriber (Spark) catches up a backlog of
``TXREPL_BENCH_MEM_SUB_T`` W1 transactions (default 10000, written at 400 txn/s) with
``batch.max_entries`` 1, 10, 100 and 1,000; RSS of the subscriber process and of its
JVM child are sampled.  Capture groups consecutive transactions into one entry (about
60 W1 transactions per entry on a busy 2-core box), hence the small batch sizes.

    .venv/bin/python -m tests.bench memory
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from common.rpc import txrepl_pb2 as pb
from common.values import encode
from publisher.log import open_log
from tests.bench.bench_w1 import Source, _env_int, run_stream, scrubbed_bench_env
from tests.support.feedclient import RawSubscriber
from tests.support.harness import Daemon, Pair, to_toml, wait_until
from tests.support.reference import ReferenceTarget
from tests.support.rss import Sampler, rss_kib
from tests.support.workload import W1, sqlite_source


class CountingTarget(ReferenceTarget):
    def apply_all(self, first_seq: int, entries: Any) -> None:
        assert first_seq == self.level + 1
        self.level = first_seq + sum(1 for _ in entries) - 1


def _entry() -> bytes:
    """One W1-sized entry: an order insert and an account update."""
    e = pb.Entry(commit_time_us=int(time.time() * 1e6), source_position="0")
    e.ops.add().row.CopyFrom(
        pb.RowChange(
            table="t",
            op=pb.ROW_OP_INSERT,
            row=[encode(123456), encode(4321), encode("new"), encode("x" * 40)],
        )
    )
    e.ops.add().row.CopyFrom(
        pb.RowChange(
            table="t", op=pb.ROW_OP_UPDATE, key=[encode(4321)], row=[encode(4321), encode(99)]
        )
    )
    return e.SerializeToString()


def build_log(directory: Path, entries: int, batch: int = 10_000) -> float:
    payload = _entry()
    started = time.perf_counter()
    with open_log(directory, fsync="interval") as log:
        body = [payload] * batch
        done = 0
        while done < entries:
            k = min(batch, entries - done)
            log.append(body[:k])
            done += k
        log.flush()
    return time.perf_counter() - started


async def _sync_through(address: str, head: int) -> float:
    client = RawSubscriber(address, "memclient", target=CountingTarget())
    started = time.perf_counter()
    await client.start()
    await client.wait_level(head, timeout=3600)
    elapsed = time.perf_counter() - started
    await client.close()
    return elapsed


def publisher_rss(size: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="txrepl-bench-mem-"))
    import sqlite3

    src = sqlite3.connect(str(work / "source.db"))
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, a INTEGER, s TEXT, n TEXT)")
    src.close()
    build_s = build_log(work / "publisher" / "publications" / "shop", size)
    cfg = {
        "server_name": "pub1",
        "listen": "127.0.0.1:0",
        "data_dir": str(work / "publisher"),
        "source": f"sqlite:///{work / 'source.db'}",
        "publication": [{"name": "shop", "tables": ["t"], "max_delta": 10**9}],
    }
    (work / "publisher.toml").write_text(to_toml(cfg))
    pub = Daemon(
        "publisher", work / "publisher.toml", work / "publisher" / "publisher.addr", work / "p.log"
    ).start(timeout=600)
    try:
        assert pub.proc is not None
        from tests.support.harness import publication_head

        head = publication_head(pub.address, "shop")
        idle = rss_kib(pub.proc.pid)
        sampler = Sampler(pub.proc.pid)
        sampler.start()
        sync_s = asyncio.run(_sync_through(pub.address, head))
        samples = sampler.stop()
        after = rss_kib(pub.proc.pid)
    finally:
        pub.stop()
    size_bytes = sum(p.stat().st_size for p in (work / "publisher" / "publications").rglob("*"))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    peak = max((s[1] for s in samples), default=after)
    return {
        "measure": "publisher_rss",
        "log_entries": head,
        "log_mib": round(size_bytes / 2**20, 1),
        "build_s": round(build_s, 1),
        "sync_s": round(sync_s, 1),
        "entries_per_s": round(head / sync_s, 1),
        "rss_idle_mib": round(idle / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_after_mib": round(after / 1024, 1),
        # VmRSS counts the mapped segment pages the kernel keeps resident (RssFile, which
        # it may drop at will); RssAnon is what the process itself holds.
        "rss_anon_peak_mib": round(max((s[3] for s in samples), default=0) / 1024, 1),
        "samples": [
            (round(t, 2), round(r / 1024, 1))
            for t, r, _, _ in samples[:: max(1, len(samples) // 200)]
        ],
    }


def subscriber_rss(txns: int, batches: list[int]) -> list[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="txrepl-bench-memsub-"))
    pair = Pair(base, tables=["accounts", "orders"])
    conn = sqlite_source(pair.source_path)
    rows = []
    try:
        pair.start_publisher()
        # Paced, so capture logs about one transaction per entry (at full speed it groups
        # the whole backlog into a handful of entries and batch size would not matter).
        run_stream(Source("sqlite", conn), list(W1().transactions(txns + 1)), 0, 400)
        wait_until(
            lambda: conn.execute("SELECT count(*) FROM _txrepl_capture").fetchone()[0] == 0,
            600,
            "capture to drain",
        )
        for b in batches:
            pair.subscriber_name = f"sub{b}"
            pair.subscriber_extra = {
                "data_dir": str(base / f"subscriber{b}"),
                "batch": {"max_entries": b},
                "target": f"sqlite:///{base / f'target{b}.db'}",
            }
            assert pair.pub is not None
            # Built by hand for a longer start-up timeout than Pair's (Spark on a busy box);
            # assigned before start() so pair.stop() stops it even if the start fails.
            sub = pair.sub = Daemon(
                "subscriber",
                pair.write_subscriber_config(pair.pub.address),
                base / f"subscriber{b}" / "subscriber.addr",
                base / f"subscriber{b}.log",
            )
            sub.start(timeout=600)
            assert sub.proc is not None
            sampler = Sampler(sub.proc.pid, with_children=True)
            sampler.start()
            started = time.perf_counter()
            pair.wait_caught_up(timeout=1800)
            elapsed = time.perf_counter() - started
            samples = sampler.stop()
            sub.stop()
            rows.append(
                {
                    "measure": "subscriber_rss",
                    "batch_max_entries": b,
                    "entries": pair.head(),
                    "transactions": txns + 1,
                    "catch_up_s": round(elapsed, 1),
                    "python_rss_peak_mib": round(max((s[1] for s in samples), default=0) / 1024, 1),
                    "jvm_rss_peak_mib": round(max((s[2] for s in samples), default=0) / 1024, 1),
                }
            )
            print(f"  subscriber batch {b}: {rows[-1]}", flush=True)
    finally:
        pair.stop()
        conn.close()
    return rows


def run(results_dir: Path) -> list[dict[str, Any]]:
    sizes = [
        int(x) for x in os.environ.get("TXREPL_BENCH_MEM_SIZES", "1000000,10000000").split(",")
    ]
    sub_t = _env_int("TXREPL_BENCH_MEM_SUB_T", 10_000)
    with scrubbed_bench_env():
        rows: list[dict[str, Any]] = []
        for size in sizes:
            row = publisher_rss(size)
            print(
                f"  publisher, log of {row['log_entries']:,} entries ({row['log_mib']} MiB): "
                f"RSS idle {row['rss_idle_mib']} MiB, peak {row['rss_peak_mib']} MiB "
                f"(anonymous {row['rss_anon_peak_mib']} MiB) while a "
                f"client synced at {row['entries_per_s']:,.0f} entries/s",
                flush=True,
            )
            rows.append(row)
        rows.extend(subscriber_rss(sub_t, [1, 10, 100, 1000]))
    _plot(results_dir, rows)
    return rows


def _plot(results_dir: Path, rows: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        if r["measure"] == "publisher_rss" and r["samples"]:
            a.plot(*zip(*r["samples"], strict=True), label=f"{r['log_entries']:,} entries")
    a.set_title("publisher RSS while a client syncs the whole log")
    a.set_xlabel("s")
    a.set_ylabel("MiB")
    a.legend()
    sub = [r for r in rows if r["measure"] == "subscriber_rss"]
    xs = [str(r["batch_max_entries"]) for r in sub]
    b.bar(xs, [r["python_rss_peak_mib"] for r in sub], label="python")
    b.bar(
        xs,
        [r["jvm_rss_peak_mib"] for r in sub],
        bottom=[r["python_rss_peak_mib"] for r in sub],
        label="JVM",
    )
    b.set_title("subscriber peak RSS by batch.max_entries")
    b.set_ylabel("MiB")
    b.legend()
    fig.tight_layout()
    results_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(results_dir / "memory.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import sys

    run(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="bench-mem-")))
