"""CPU seconds the daemons spend over a bench phase (issue 23: CPU per transaction).

On two cores the lag's p99 is a scheduling delay, so what a daemon costs per
transaction is the figure to compare across versions: :class:`CpuMeter` reads
``utime + stime`` of each process (all its threads) from ``/proc/<pid>/stat``
before and after a phase.  Linux only; elsewhere (or for a process gone) the
figure is left out.

``TXREPL_BENCH_PROFILE=<path of py-spy>`` (bench_w1 reads it) also records the
publisher with py-spy during the paced lag phase, into the results directory as
collapsed stacks (``py-spy record --format raw``): where its CPU goes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["CpuMeter", "process_cpu_s", "py_spy"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int, where: str = "") -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None: not readable);
    ``where``: another ``/proc`` entry (a thread's: ``<pid>/task/<tid>``)."""
    try:
        text = Path(f"/proc/{where or pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: the fields after it follow its ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of stat(5)


class CpuMeter:
    """CPU seconds of named processes between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._before: dict[str, float] = {}

    def start(self) -> None:
        self._before = {}
        for name, pid in self.pids.items():
            now = process_cpu_s(pid)
            if now is not None:
                self._before[name] = now

    def stop(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, before in self._before.items():
            now = process_cpu_s(self.pids[name])
            if now is not None:
                out[name] = round(now - before, 3)
        return out


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of ``pid``, by ``<tid> <name>``."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        cpu = process_cpu_s(int(task.name), f"{pid}/task/{task.name}")
        if cpu is not None:
            out[f"{task.name} {name}"] = cpu
    return out


@contextlib.contextmanager
def py_spy(binary: str | None, pid: int | None, out: Path) -> Iterator[None]:
    """Record ``pid`` with py-spy (collapsed stacks into ``out``, with thread ids) while
    the block runs, and each thread's CPU seconds (into ``out`` + ``.threads``)."""
    if not binary or pid is None:
        yield
        return
    before = thread_cpu_s(pid)
    proc = subprocess.Popen(
        [
            binary,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
            "--threads",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        after = thread_cpu_s(pid)
        lines = sorted(((v - before.get(k, 0.0), k) for k, v in after.items()), reverse=True)
        Path(f"{out}.threads").write_text("".join(f"{v:8.3f} {k}\n" for v, k in lines))
        proc.send_signal(2)  # SIGINT: py-spy writes what it sampled and exits
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
