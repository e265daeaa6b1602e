"""The machine's CPU over a lag phase, process by process (issue 23: the in-sync p99).

On this project's two cores the in-sync lag's tail is the time an entry's next
thread waits for a core (docs/performance.md), so the figure that explains it is how
busy the cores are and who keeps them busy: the daemons, the database servers'
processes working for them, and the bench's own writer and visibility poller, which
load the machine the same for every system (PostgreSQL's own replication included).

:class:`Budget` reads, at the phase's start and end, the machine's idle time
(``/proc/stat``: the idle and iowait jiffies of all CPUs) and each named group's
processes' CPU (``utime + stime`` from ``/proc/<pid>/stat``, all threads).
``busy_cores`` is the cores minus the idle time over the phase's wall time (2.0: both
cores never idle); a group's ``cpu_s`` is its seconds over the phase.  Busy is
counted as "not idle" rather than as the sum of the busy jiffies because on this VM
those are sampled by a tick that misses beats under load: over 2 s of W1's paced
phase the busy and idle jiffies added up to 338-350 of the 400 the two cores had
(2026-11-25, steal reported 0), while the processes' own CPU (which the kernel keeps
exactly) added up to within 0.04-0.07 cores of "not idle".  What no group names (the
kernel's threads, other users of the machine) is the difference between
``busy_cores`` and the groups' sum.

A PostgreSQL cluster's processes are grouped by ``pg_stat_activity`` at the phase's
start (:func:`pg_groups`): its walsenders, logical replication workers (native's
apply), txrepl's subscriber backends, the other client backends (the bench's writer
on the source, its poller on the target) and the background processes.  Linux only;
elsewhere the budget is left out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.bench._cpu import process_cpu_s

__all__ = ["Budget", "describe", "machine_idle_s", "pg_groups"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_IDLE = (3, 4)  # idle, iowait (proc(5), /proc/stat's "cpu" line)


def machine_idle_s() -> float | None:
    """CPU seconds all cores have been idle since boot (None: no ``/proc/stat``)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:]]
    return sum(values[i] for i in _IDLE if i < len(values)) / _TICK


def pg_groups(dsn: str, label: str) -> dict[str, list[int]]:
    """A running cluster's processes by what they do for the pipeline (module docstring),
    each group named ``<label> <what>``; the query's own backend left out."""
    import psycopg

    groups: dict[str, list[int]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, coalesce(backend_type, ''), coalesce(application_name, '')"
            " FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        ).fetchall()
    for pid, kind, app in rows:
        if kind == "walsender":
            what = "walsender"
        elif kind.startswith("logical replication") and "launcher" not in kind:
            what = "apply worker"
        elif app == "txrepl-subscriber":
            what = "txrepl backends"
        elif kind == "client backend":
            what = "client backends"
        else:
            what = "background"
        groups.setdefault(f"{label} {what}", []).append(int(pid))
    return groups


class Budget:
    """The machine's busy cores and each group's CPU seconds between start and stop."""

    def __init__(self, groups: Mapping[str, list[int]]) -> None:
        self.groups = {name: list(pids) for name, pids in groups.items() if pids}
        self._start: tuple[float, float | None, dict[int, float]] | None = None

    def _cpu(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for pids in self.groups.values():
            for pid in pids:
                now = process_cpu_s(pid)
                if now is not None:
                    out[pid] = now
        return out

    def start(self) -> None:
        self._start = (time.monotonic(), machine_idle_s(), self._cpu())

    def stop(self) -> dict[str, Any]:
        """``{"busy_cores": …, "cores": …, "cpu_s": {group: seconds}}``; empty when the
        machine's counters cannot be read."""
        if self._start is None:
            return {}
        began, idle_before, before = self._start
        wall = time.monotonic() - began
        idle_after = machine_idle_s()
        after = self._cpu()
        if idle_before is None or idle_after is None or wall <= 0:
            return {}
        cores = os.cpu_count() or 1
        cpu: dict[str, float] = {}
        for name, pids in self.groups.items():
            spent = [after[p] - before[p] for p in pids if p in before and p in after]
            if spent:
                cpu[name] = round(sum(spent), 3)
        return {
            "busy_cores": round(max(0.0, cores - (idle_after - idle_before) / wall), 2),
            "cores": cores,
            "cpu_s": cpu,
        }


def describe(machine: Mapping[str, Any], txns: int) -> str:
    """One line: the busy cores, then each group's CPU per 1,000 transactions, largest
    first, and what no group names."""
    cpu: Mapping[str, float] = machine.get("cpu_s", {})
    wall_busy = machine.get("busy_cores", 0.0)
    per = sorted(((v * 1000 / txns, k) for k, v in cpu.items()), reverse=True)
    return (
        f"machine: {wall_busy} of {machine.get('cores')} cores busy; CPU s per 1,000 txn: "
        + ", ".join(f"{k} {v:.3f}" for v, k in per if v >= 0.0005)
    )
