"""Reading a daemon's ``/metrics`` as a test (or an operator's script) would."""

from __future__ import annotations

import re
import urllib.request

__all__ = ["Samples", "metrics_text", "scrape"]

# (metric name with its suffix, {label: value}) -> value
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metrics_text(address: str) -> str:
    """The exposition text served at ``http://address/metrics``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def scrape(address: str) -> Samples:
    """Every sample of ``/metrics`` at ``address``."""
    out: Samples = {}
    for line in metrics_text(address).splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out
