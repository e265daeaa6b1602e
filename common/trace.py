"""A per-transaction trace of the stages (a diagnostic for issue 23; off by default).

The latency histograms (common/latency.py) say how long each stage takes, not which
stage made one given slow transaction slow.  With ``trace_every = N`` (N > 0) in a
daemon's config (``TXREPL_TRACE_EVERY``), the daemon records, for every seq that is
a multiple of N, the wall-clock time (integer µs, ``time.time()``) each stage
ended, plus a few events around them (batches, GC passes, cuts, capture wake-ups,
flush polls, the threads' run-queue wait).  Both go to bounded rings in memory (the
oldest records fall off) and are written to ``<data_dir>/trace.jsonl`` at exit and
on ``SIGUSR2`` (tmp, then rename: a reader never sees half a file).

Stages, in the order one entry passes them (each is a moment, not a duration)::

    publisher:  commit    the source's commit time (the entry's commit_time_us)
                appended  its append to the log began (the capture built it)
                durable   the publication saw the head pass it (fsynced, visible)
                sent      the feed stamped its message (Batch.sent_us) for gRPC
    subscriber: received  the stream read the message
                taken     an apply took the batch holding it
                planned   the batch's target write began (its plan done)
                committed the target COMMIT returned

Ordering (what makes the stages of one seq ascend): ``durable`` is settled by the
feed itself before it stamps ``sent`` when the log's listener has not done it yet
(``Publication.traced_send``); ``sent`` is stamped before the message is written,
so the subscriber reads it after; ``taken`` comes from the pipeline's monotonic
clock, converted with an offset read between two wall-clock reads (its error is
half the smaller gap of three tries, well under a µs).  Clock steps (NTP) are not
handled: a diagnostic on one machine.

Cost: when off, each hook is one test of ``TRACE`` (a module attribute); when on,
a modulo per entry and a deque append per traced stage, and a thread that reads the
threads' scheduler counters every 10 ms (``runq`` events: :func:`_sample_runqueue`).
Each record is a tuple; ``deque.append`` and ``deque.copy`` are single C calls, so
threads need no lock.

File: one JSON object per line: ``{"seq": s, "stage": name, "us": t}`` or
``{"event": kind, "us": t, ...}``.  Read it with :func:`load`.
"""

from __future__ import annotations

import atexit
import collections
import gc
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = [
    "PUBLISHER_STAGES",
    "SUBSCRIBER_STAGES",
    "TRACE",
    "Trace",
    "check_every",
    "enable",
    "load",
    "wall_offset",
]

PUBLISHER_STAGES = ("commit", "appended", "durable", "sent")
SUBSCRIBER_STAGES = ("received", "taken", "planned", "committed")
_RING = 400_000  # stage records kept (8 per traced seq: 50,000 seqs)
_EVENTS = 200_000


class Trace:
    """The rings of one daemon: stage marks of every ``every``-th seq, and events."""

    def __init__(self, every: int, path: Path) -> None:
        if every <= 0:
            raise ValueError(f"trace_every must be positive, not {every}")
        self.every = every
        self.path = path
        self.marks: collections.deque[tuple[int, str, int]] = collections.deque(maxlen=_RING)
        # An event's details as (key, value) pairs, not a dict: tuples of numbers and
        # strings leave the GC's care after one collection, a dict stays in it (the
        # rings' records would have fed the full collections of the daemon they watch).
        self.events: collections.deque[tuple[str, int, tuple[tuple[str, Any], ...]]] = (
            collections.deque(maxlen=_EVENTS)
        )
        self._gc_start = 0.0
        self._dump_lock = threading.Lock()

    def mark(self, seq: int, stage: str, us: int) -> None:
        if seq % self.every == 0:
            self.marks.append((seq, stage, us))

    def span(self, first: int, count: int, stage: str, us: int) -> None:
        """Seqs ``first .. first + count - 1`` reached ``stage`` at ``us``."""
        every = self.every
        seq = first + (-first) % every  # the first multiple of every from first
        end = first + count
        marks = self.marks
        while seq < end:
            marks.append((seq, stage, us))
            seq += every

    def event(self, kind: str, **info: Any) -> None:
        self.events.append((kind, int(time.time() * 1_000_000), tuple(info.items())))

    def applied(
        self, first: int, count: int, taken_mono: float, write_s: float, committed: float
    ) -> None:
        """A batch of ``count`` entries from ``first`` committed at ``committed`` (wall);
        it was taken at ``taken_mono`` (monotonic) and its write took ``write_s``."""
        taken = int((taken_mono + wall_offset()) * 1_000_000)
        done = int(committed * 1_000_000)
        planned = max(taken, done - int(write_s * 1_000_000))
        self.span(first, count, "taken", taken)
        self.span(first, count, "planned", planned)
        self.span(first, count, "committed", done)
        self.event("applied", first=first, entries=count, write_ms=round(write_s * 1000, 3))

    # -- GC passes, as events (gc.callbacks) ---------------------------------------------

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            ms = (time.perf_counter() - self._gc_start) * 1000
            self.event("gc", generation=info.get("generation"), ms=round(ms, 3))

    # -- writing ---------------------------------------------------------------------------

    def dump(self) -> Path:
        """Write both rings to :attr:`path` (tmp, then rename); returns it.  A dump
        asked for while one runs (SIGUSR2 during the exit's) is skipped, and a
        failure to write is said in one line on stderr, not raised: a diagnostic
        must not stop the daemon, nor turn its exit into a traceback."""
        if not self._dump_lock.acquire(blocking=False):
            return self.path
        try:
            marks, events = self.marks.copy(), self.events.copy()
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                for seq, stage, us in marks:
                    f.write(f'{{"seq": {seq}, "stage": "{stage}", "us": {us}}}\n')
                for kind, us, info in events:
                    f.write(json.dumps({"event": kind, "us": us, **dict(info)}) + "\n")
            os.replace(tmp, self.path)
        except OSError as e:
            print(f"txrepl: trace not written to {self.path}: {e.strerror}", file=sys.stderr)
        finally:
            self._dump_lock.release()
        return self.path


TRACE: Trace | None = None


def check_every(every: int) -> None:
    """A daemon config's ``trace_every``: 0 (off) or a positive N (ValueError)."""
    if every < 0:
        raise ValueError(f"trace_every must be 0 (off) or a positive N, not {every}")


def enable(every: int, data_dir: Path) -> Trace | None:
    """Start tracing this process (``every`` 0: stay off); written at exit and on SIGUSR2."""
    global TRACE
    if every <= 0:
        return None
    data_dir.mkdir(parents=True, exist_ok=True)
    trace = TRACE = Trace(every, data_dir / "trace.jsonl")
    gc.callbacks.append(trace._gc)
    threading.Thread(target=_sample_runqueue, args=(trace,), name="trace-runq", daemon=True).start()
    atexit.register(trace.dump)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR2, lambda *_: trace.dump())
    return trace


def _sample_runqueue(trace: Trace, interval: float = 0.01) -> None:
    """Every ``interval``, the time this process's threads spent runnable but not
    running (the kernel's run-queue wait, ``/proc/self/task/*/schedstat``): an event
    ``runq`` when it exceeds 1 ms.  It tells a stall of the machine (other processes
    held the cores) from one of our own (a thread waiting for the GIL sleeps: it is
    not runnable, so it adds nothing here).  Linux only; elsewhere it just stops."""
    tasks = "/proc/self/task"
    last: dict[str, tuple[int, int]] = {}
    at = time.monotonic()
    while True:
        time.sleep(interval)
        before, at = at, time.monotonic()
        wait = cpu = 0
        try:
            names = os.listdir(tasks)
        except OSError:
            return
        # Python threads by native id (the rest: gRPC's, the JVM bridge's, ...).
        named = {str(t.native_id): t.name for t in threading.enumerate()}
        waits: list[tuple[str, float]] = []
        for name in names:
            try:
                with open(f"{tasks}/{name}/schedstat", "rb") as f:
                    c, w = (int(x) for x in f.read().split()[:2])
            except (OSError, ValueError):
                continue  # a thread that ended meanwhile
            prev = last.get(name)
            last[name] = (c, w)
            if prev is not None:
                cpu, wait = cpu + c - prev[0], wait + w - prev[1]
                if w - prev[1] > 1_000_000:
                    waits.append((named.get(name, "other"), round((w - prev[1]) / 1e6, 2)))
        if wait > 1_000_000:
            trace.event(
                "runq",
                wait_ms=round(wait / 1e6, 2),  # summed over threads
                cpu_ms=round(cpu / 1e6, 2),
                span_ms=round((at - before) * 1000, 2),  # since the last sample
                threads=tuple(waits),  # (name, ms) of each thread that waited > 1 ms
            )


def wall_offset() -> float:
    """``time.time() - time.monotonic()`` now, read between two wall-clock reads (the
    pair with the smallest gap of three)."""
    best_gap, best = float("inf"), 0.0
    for _ in range(3):
        a = time.time()
        m = time.monotonic()
        b = time.time()
        if b - a < best_gap:
            best_gap, best = b - a, (a + b) / 2 - m
    return best


def load(path: Path) -> tuple[dict[int, dict[str, int]], list[dict[str, Any]]]:
    """A trace file's stages per seq ({seq: {stage: µs}}) and its events."""
    seqs: dict[int, dict[str, int]] = {}
    events: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if "seq" in rec:
                seqs.setdefault(rec["seq"], {})[rec["stage"]] = rec["us"]
            else:
                events.append(rec)
    return seqs, events
