"""The worst lag markers of a phase, stage by stage, from the daemons' traces.

With ``TXREPL_BENCH_TRACE=1`` bench w1 starts the daemons with ``TXREPL_TRACE_EVERY=1``
(common/trace.py: every seq's stage times, and events) and, after each lag phase,
asks both for their trace (SIGUSR2), joins each marker with its entry and prints the
worst markers' time in each leg, with what happened meanwhile.

Join: the bench's writer runs one transaction at a time and notes the wall time its
COMMIT returned; the marker's entry is the one whose source commit time (the
server's, traced as ``commit``) is the latest at or before it.  PostgreSQL capture
makes one entry per source transaction, so this is exact there.
"""

from __future__ import annotations

import bisect
import itertools
import os
import shutil
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from common.trace import PUBLISHER_STAGES, SUBSCRIBER_STAGES, load

__all__ = ["ENV", "LEGS", "phase_trace"]

ENV = "TXREPL_BENCH_TRACE"
ORDER = PUBLISHER_STAGES + SUBSCRIBER_STAGES
# A leg: the time between two consecutive stages (the last: until the poller saw it).
LEGS = [f"{a}>{b}" for a, b in itertools.pairwise(ORDER)] + ["committed>seen"]
WORST = 10


def _dump(pid: int, path: Path, timeout: float = 30.0) -> bool:
    """SIGUSR2 to ``pid`` and wait for its new trace file."""
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def phase_trace(
    daemons: dict[str, Any],
    commits: dict[int, float],
    seen: dict[int, float],
    started: float,
    keep: Path,
) -> dict[str, Any]:
    """Per-marker legs (ms) and the worst markers with their surroundings; printed too.
    The traces are copied to ``keep``-publisher.jsonl and ``keep``-subscriber.jsonl."""
    data: dict[str, tuple[dict[int, dict[str, int]], list[dict[str, Any]]]] = {}
    for kind in ("publisher", "subscriber"):
        d = daemons.get(kind)
        if d is None or d.proc is None:
            return {}
        path = d.addr_file.parent / "trace.jsonl"
        if not _dump(d.proc.pid, path):
            print(f"trace: no trace from the {kind} (is trace_every on?)")
            return {}
        data[kind] = load(path)
        shutil.copyfile(path, f"{keep}-{kind}.jsonl")
    (pub, pub_ev), (sub, sub_ev) = data["publisher"], data["subscriber"]
    by_commit = sorted((st["commit"], seq) for seq, st in pub.items() if "commit" in st)
    times = [t for t, _ in by_commit]
    rows: list[dict[str, Any]] = []
    for m, c in commits.items():
        if m not in seen:
            continue
        i = bisect.bisect_right(times, int(c * 1_000_000)) - 1
        if i < 0:
            continue
        seq = by_commit[i][1]
        st = {**pub.get(seq, {}), **sub.get(seq, {})}
        if any(s not in st for s in ORDER):
            continue
        st["seen"] = int(seen[m] * 1_000_000)
        legs = {leg: (st[leg.split(">")[1]] - st[leg.split(">")[0]]) / 1000 for leg in LEGS}
        rows.append(
            {
                "marker": m,
                "seq": seq,
                "t_s": round(c - started, 3),
                "lag_ms": round((seen[m] - c) * 1000, 2),
                "source_ms": round((st["commit"] - c * 1_000_000) / 1000, 2),
                "legs": legs,
                "at": st,
            }
        )
    if not rows:
        print("trace: no marker joined")
        return {}
    rows.sort(key=lambda r: r["lag_ms"], reverse=True)
    worst = rows[:WORST]
    print(f"trace: {len(rows)} markers joined; legs in ms (median of all | worst {WORST})")
    print("  " + "  ".join(f"{leg}={statistics.median(r['legs'][leg] for r in rows):.2f}"
                           for leg in LEGS))  # fmt: skip
    for r in worst:
        lo, hi = r["at"]["commit"], r["at"]["seen"]
        print(f"  marker {r['marker']} seq {r['seq']} t={r['t_s']}s lag {r['lag_ms']} ms: "
              + " ".join(f"{leg}={v:.2f}" for leg, v in r["legs"].items()))  # fmt: skip
        print("      meanwhile: " + _around(pub_ev, sub_ev, lo, hi))
    tail = _tail_legs(pub, sub, int(started * 1_000_000))
    print("  entries' worst 1 % (source commit → target commit), median leg ms: "
          + "  ".join(f"{leg}={v:.2f}" for leg, v in tail.items()))  # fmt: skip
    return {
        "joined": len(rows),
        "tail_legs_ms": tail,
        "median_legs_ms": {
            leg: round(statistics.median(r["legs"][leg] for r in rows), 3) for leg in LEGS
        },
        "worst": [{k: v for k, v in r.items() if k != "at"} for r in worst],
    }


def _around(pub_ev: list[dict[str, Any]], sub_ev: list[dict[str, Any]], lo: int, hi: int) -> str:
    """What the daemons did between a marker's source commit and its sighting."""
    out = []
    for who, events in (("pub", pub_ev), ("sub", sub_ev)):
        inside = [e for e in events if lo <= e["us"] <= hi]
        gcs = [e for e in inside if e["event"] == "gc"]
        if gcs:
            worst_gc = max(gcs, key=lambda e: e["ms"])
            out.append(
                f"{who} gc x{len(gcs)} {sum(e['ms'] for e in gcs):.2f} ms "
                f"(max gen{worst_gc['generation']} {worst_gc['ms']:.2f})"
            )
        sizes = [e["entries"] for e in inside if e["event"] in ("applied", "sent")]
        if sizes:
            out.append(f"{who} batches {sizes[:12]}{'…' if len(sizes) > 12 else ''}")
        runq = [e["wait_ms"] for e in inside if e["event"] == "runq"]
        if runq:
            out.append(f"{who} runnable, not running {sum(runq):.1f} ms")
        for kind in ("capture_woke", "flush_poll", "cut"):
            n = [e for e in inside if e["event"] == kind]
            if n:
                extra = f" {max(e['ms'] for e in n):.2f} ms max" if kind == "flush_poll" else ""
                out.append(f"{who} {kind} x{len(n)}{extra}")
        writes = [e["write_ms"] for e in inside if e["event"] == "applied"]
        if writes:
            out.append(f"sub writes max {max(writes):.2f} ms")
    return "; ".join(out) or "nothing recorded"


def _tail_legs(
    pub: dict[int, dict[str, int]], sub: dict[int, dict[str, int]], since_us: int
) -> dict[str, float]:
    """Over every traced entry of the phase (not only markers): the worst 1 % by source
    commit → target commit, and the median of each leg among them (ms)."""
    whole = []
    for seq, p in pub.items():
        st = {**p, **sub.get(seq, {})}
        if st.get("commit", 0) >= since_us and all(s in st for s in ORDER):
            whole.append(st)
    if not whole:
        return {}
    whole.sort(key=lambda st: st["committed"] - st["commit"], reverse=True)
    worst = whole[: max(1, len(whole) // 100)]
    out = {"total": statistics.median(st["committed"] - st["commit"] for st in worst) / 1000}
    for a, b in itertools.pairwise(ORDER):
        out[f"{a}>{b}"] = statistics.median(st[b] - st[a] for st in worst) / 1000
    return {k: round(v, 3) for k, v in out.items()}
