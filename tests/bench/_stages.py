"""Stage latency in benchmarks: the daemons' per-stage histograms (common/latency.py) read
from ``/metrics`` before and after a phase, turned into p50 / p99 per stage.

The quantiles come from the bucket counts of the phase (the difference of two scrapes),
interpolated linearly inside a bucket, as PromQL's ``histogram_quantile`` does: exact
to a bucket's width (0.25-0.5 ms below 2 ms, 1 ms up to 5 ms, 2.5-5 ms up to 15 ms).
"""

from __future__ import annotations

import math
from typing import Any

from tests.support.scrape import Samples, scrape

__all__ = ["StageScrape", "format_stages", "stage_quantiles"]

_FAMILIES = ("txrepl_publication_stage_seconds", "txrepl_subscription_stage_seconds")


class StageScrape:
    """Scrapes the stage histograms of some daemons (``host:port`` of their /metrics)."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses

    def take(self) -> Samples:
        out: Samples = {}
        for a in self.addresses:
            try:
                out.update(scrape(a))
            except OSError:
                continue
        return out


def stage_quantiles(before: Samples, after: Samples) -> dict[str, dict[str, float]]:
    """Stage → {count, mean_ms, p50_ms, p99_ms} over what happened between two scrapes."""
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    for (name, labels), value in after.items():
        base = next((f for f in _FAMILIES if name.startswith(f)), None)
        if base is None:
            continue
        lab = dict(labels)
        stage = lab.get("stage", "")
        delta = value - before.get((name, labels), 0.0)
        if name == base + "_bucket":
            le = math.inf if lab["le"] == "+Inf" else float(lab["le"])
            per = buckets.setdefault(stage, {})
            per[le] = per.get(le, 0.0) + delta
        elif name == base + "_sum":
            sums[stage] = sums.get(stage, 0.0) + delta
    out: dict[str, dict[str, float]] = {}
    for stage, per in buckets.items():
        bounds = sorted(per)
        total = per.get(math.inf, 0.0)
        if total <= 0:
            continue
        out[stage] = {
            "count": total,
            "mean_ms": round(sums.get(stage, 0.0) / total * 1000, 3),
            "p50_ms": round(_quantile(0.5, bounds, per, total) * 1000, 3),
            "p99_ms": round(_quantile(0.99, bounds, per, total) * 1000, 3),
        }
    return out


def _quantile(q: float, bounds: list[float], cumulative: dict[float, float], total: float) -> float:
    rank = q * total
    lower, below = 0.0, 0.0
    for b in bounds:
        c = cumulative[b]
        if c >= rank:
            if math.isinf(b):
                return lower
            inside = c - below
            return lower + (b - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = b, c
    return lower


_ORDER = ("poll", "capture", "durable", "send", "receive", "queue", "apply", "commit", "total")


def format_stages(stages: dict[str, Any]) -> str:
    """One line: ``stage p50/p99 ms`` in path order."""
    parts = [
        f"{s} {stages[s]['p50_ms']:.2f}/{stages[s]['p99_ms']:.2f}" for s in _ORDER if s in stages
    ]
    return "stages p50/p99 ms: " + ", ".join(parts) if parts else "no stage figures"
