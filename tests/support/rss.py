"""Memory of a running process, sampled from /proc (benchmarks and memory-bound tests).

``Sampler`` records, every ``every`` seconds, a process's VmRSS and RssAnon and
(if asked) its children's VmRSS (the subscriber's JVM).  VmRSS also counts the
file pages of a publisher's mmapped log segments, which the kernel reclaims at
will; RssAnon is what the process itself holds.  ``start_sampled`` starts a
daemon with a sampler running from the moment it is spawned: a publisher starts
capturing before it is ready, so sampling from readiness could miss its peak.
"""

from __future__ import annotations

import threading
import time

from tests.support.harness import Daemon, wait_until

__all__ = ["Sampler", "children", "rss_kib", "start_sampled"]


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A /proc/<pid>/status memory field in KiB (VmRSS, RssAnon, RssFile)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class Sampler(threading.Thread):
    """Samples the RSS of a process (and, if asked, of its children) until stopped."""

    def __init__(self, pid: int, with_children: bool = False, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.with_children, self.every = pid, with_children, every
        # (t, own VmRSS KiB, children VmRSS KiB, own RssAnon KiB)
        self.samples: list[tuple[float, int, int, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.halt.wait(self.every):
            kids = sum(rss_kib(c) for c in children(self.pid)) if self.with_children else 0
            anon = rss_kib(self.pid, "RssAnon")
            self.samples.append((time.monotonic() - t0, rss_kib(self.pid), kids, anon))

    def stop(self) -> list[tuple[float, int, int, int]]:
        self.halt.set()
        self.join(5)
        return self.samples

    def peak_mib(self, column: int) -> float:
        """The largest sample of ``column`` (1 VmRSS, 2 children's VmRSS, 3 RssAnon), MiB."""
        return round(max((s[column] for s in self.samples), default=0) / 1024, 1)


def start_sampled(
    daemon: Daemon, *, timeout: float = 90.0, with_children: bool = False, every: float = 0.25
) -> Sampler:
    """Start ``daemon`` and return a running :class:`Sampler` on it, begun at its spawn."""
    before = daemon.proc  # a Daemon started again keeps its last process until then
    failed: list[BaseException] = []

    def start() -> None:
        try:
            daemon.start(timeout)
        except BaseException as exc:  # re-raised below, in the caller's thread
            failed.append(exc)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    wait_until(lambda: daemon.proc is not before or not starter.is_alive(), timeout, "a spawn")
    sampler = None
    proc = daemon.proc
    if proc is not None and proc is not before:
        sampler = Sampler(proc.pid, with_children=with_children, every=every)
        sampler.start()
    starter.join()
    if failed or sampler is None:
        if sampler is not None:
            sampler.stop()
        raise failed[0] if failed else RuntimeError(f"{daemon.kind} was not spawned")
    return sampler
