"""Publisher restart → capture (issue 23, start-up): a SQLite source with W1 tables.

A publisher on a W1 SQLite source captures T transactions (a log of T + 1
entries), then, ``TXREPL_BENCH_RUNS`` times (default 7): stop it (SIGTERM), commit
one W1 transaction on the source, start it again (``python -m publisher run
--config ...``, on the same port) and time, from the launch, until the
publication's head (Admin ``ListPublications``, polled every 2 ms) holds that
transaction — the W1 bench's ``publisher_restart_to_capture_s`` — and until the
log's segment files grew (``restart_to_logged_s``: the entry written, seen from
outside, before the port may serve).  ``ready_s`` is
the launch to the ``publisher ready`` log line (port bound, logs open, capture
started).  Medians and ranges.

``TXREPL_BENCH_STARTUP_BASE=<dir>`` also runs the publisher of another tree (a
worktree of main at the base commit) on its own copy of the same data, the two
restarted in turn (interleaved), for a same-sitting before/after.

Environment: ``TXREPL_BENCH_STARTUP_T`` (default 30000), ``TXREPL_BENCH_RUNS``.

    .venv/bin/python -m tests.bench startup
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.harness import Pair, wait_until
from tests.support.workload import W1, run_sqlite, sqlite_source

ROOT = Path(__file__).resolve().parents[2]


class Rig:
    """One publisher (of ``tree``) on its own W1 SQLite source and log."""

    def __init__(self, name: str, base: Path, tree: Path, txns: list[Any]) -> None:
        self.name = name
        work = base / name
        work.mkdir()
        self.pair = Pair(work, tables=["accounts", "orders"])
        self.tree = tree
        self.src = sqlite_source(self.pair.source_path)
        self.start()
        run_sqlite(self.src, txns)
        wait_until(self.drained, 600, "the backlog to be captured")

    def drained(self) -> bool:
        return bool(self.src.execute("SELECT count(*) FROM _txrepl_capture").fetchone()[0] == 0)

    def start(self, listen: str = "127.0.0.1:0") -> None:
        daemon = self.pair.publisher_daemon(listen)
        daemon.cwd = self.tree  # ``-m publisher`` imports from the working directory
        self.pair.pub = daemon.start()

    def log_bytes(self) -> int:
        logdir = self.pair.workdir / "publisher" / "publications" / self.pair.publication
        return sum(p.stat().st_size for p in logdir.glob("*.seg"))

    def restart(self, txn: list[Any]) -> tuple[float, float, float | None]:
        """(launch → the log file grew, launch → the head served over gRPC moved,
        launch → ``publisher ready``)."""
        pub = self.pair.pub
        assert pub is not None
        listen, before = pub.address, self.pair.head()
        pub.stop()
        run_sqlite(self.src, [txn])
        size = self.log_bytes()
        grew: list[float] = []

        def watch() -> None:  # beside start(), which waits for the addr file
            while not grew and time.time() - launched < 60:
                if self.log_bytes() > size:
                    grew.append(time.time())
                time.sleep(0.001)

        launched = time.time()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        self.start(listen)
        wait_until(lambda: self.pair.head() > before, 60, "capture to resume", interval=0.002)
        served = time.time() - launched
        watcher.join(60)
        assert grew, "the log never grew"
        return grew[0] - launched, served, _ready_at(pub.log_path, launched)

    def close(self) -> None:
        self.pair.stop()
        self.src.close()


def _ready_at(log_path: Path, after: float) -> float | None:
    """Seconds from ``after`` to the last ``publisher ready`` line logged after it."""
    at = None
    for line in log_path.read_text(errors="replace").splitlines():
        if '"publisher ready"' in line:
            stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
            t = datetime.datetime.fromisoformat(stamp).timestamp()
            if t >= after:
                at = t - after
    return at


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def run(results_dir: Path) -> list[dict[str, Any]]:
    t = int(os.environ.get("TXREPL_BENCH_STARTUP_T", "30000"))
    runs = int(os.environ.get("TXREPL_BENCH_RUNS", "7"))
    trees = {"txrepl": ROOT}
    if os.environ.get("TXREPL_BENCH_STARTUP_BASE"):
        trees = {"base": Path(os.environ["TXREPL_BENCH_STARTUP_BASE"]), **trees}
    txns = list(W1().transactions(t + 1 + runs))
    loads = [os.getloadavg()[0]]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        rigs = [Rig(name, Path(tmp), tree, txns[: t + 1]) for name, tree in trees.items()]
        logged: dict[str, list[float]] = {r.name: [] for r in rigs}
        served: dict[str, list[float]] = {r.name: [] for r in rigs}
        ready: dict[str, list[float]] = {r.name: [] for r in rigs}
        try:
            for i in range(runs):
                for rig in rigs if i % 2 == 0 else reversed(rigs):
                    grew_s, served_s, ready_s = rig.restart(txns[t + 1 + i])
                    logged[rig.name].append(grew_s)
                    served[rig.name].append(served_s)
                    if ready_s is not None:
                        ready[rig.name].append(ready_s)
                loads.append(os.getloadavg()[0])
        finally:
            for rig in rigs:
                rig.close()
    for name in trees:
        row: dict[str, Any] = {
            "system": name,
            "log_entries": t + 1,
            "runs": runs,
            "restart_to_logged_s": _summary(logged[name]),
            "restart_to_capture_s": _summary(served[name]),
            "ready_s": _summary(ready[name]) if ready[name] else None,
            "load_1m": [round(x, 2) for x in loads],
        }
        rows.append(row)
        rl, rc, rd = row["restart_to_logged_s"], row["restart_to_capture_s"], row["ready_s"] or {}
        print(
            f"{name:8} restart → in the log file {rl['median']} s [{rl['min']}-{rl['max']}], "
            f"→ head served {rc['median']} s [{rc['min']}-{rc['max']}], "
            f"ready {rd.get('median')} s; {runs} restarts"
        )
    for key in ("restart_to_logged_s", "restart_to_capture_s"):
        if len(rows) == 2:
            ratio = rows[0][key]["median"] / rows[1][key]["median"]
            print(f"{key}: base / txrepl = {ratio:.2f}x")
    print(f"load (1 min) {loads}")
    (results_dir / "bench_startup.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    run(out)
