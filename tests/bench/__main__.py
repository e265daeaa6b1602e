"""``make bench``: run every benchmark module ``tests/bench/bench_*.py``.

Each module has ``run(results_dir: Path) -> list[dict]``; it prints its own table.
All rows are appended as JSON lines to ``bench-results/<UTC date-time>/results.jsonl``
(plus whatever files a module writes there, such as plots).  Benchmarks are not
tests: they measure, and never fail on a number.

    python -m tests.bench                 # all
    python -m tests.bench log w1          # only bench_log and bench_w1
    python -m tests.bench snapshot        # snapshot load into PostgreSQL beside native sync
    python -m tests.bench pg_capture      # PostgreSQL capture: catch-up, decode, snapshot
    python -m tests.bench pg_sync         # PostgreSQL capture thread's CPU per txn in sync

Modules: backlog, big_txn, cluster, conflicts, fanout, feed_cpu, log, memory, pg_capture, pg_sync,
snapshot, sqlite_capture, startup, sub_cpu, w1
(docs/benchmarks.md has the latest figures of each, with the command and the date;
conflicts: docs/conflicts.md).
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    names = sorted(
        m.name[len("bench_") :]
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if m.name.startswith("bench_")
    )
    wanted = argv or names
    unknown = [w for w in wanted if w not in names]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(names)}")
        return 2
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "bench-results" / stamp
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "a", encoding="utf-8") as f:
        for name in wanted:
            module = importlib.import_module(f"tests.bench.bench_{name}")
            print(f"== bench {name}", flush=True)
            started = time.monotonic()
            rows = module.run(out)
            for row in rows:
                f.write(json.dumps({"bench": name, "at": stamp, **row}) + "\n")
            print(f"== bench {name}: {len(rows)} rows in {time.monotonic() - started:.0f}s")
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
