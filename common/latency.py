"""Where the milliseconds of one entry go: a latency histogram per stage (issue 23).

The path of one committed source transaction, and the stage that measures each
leg (docs/performance.md has the waits on it and the figures)::

    source COMMIT ─capture─▶ handed to the log ─durable─▶ fsynced, head moved
      ─send─▶ written to the feed's stream ─receive─▶ read by the subscriber
      ─queue─▶ taken by an apply ─apply─▶ planned ─commit─▶ target COMMIT returned
    total: source COMMIT → target COMMIT returned (the batch's oldest entry)

Publisher (``txrepl_publication_stage_seconds{publication, stage}``):

``capture``  the entry's ``commit_time_us`` → its append to the log began.  A
             PostgreSQL source's commit time is the server's commit timestamp;
             a SQLite source has none (triggers cannot read a clock that the
             commit would keep), so its entries carry the capture time and this
             stage reads ~0 there: its wait for the capture is ``poll``.
``poll``     a SQLite source only (one observation per capture step that
             appended): the check that saw a commit, less the later of the last
             check that saw none and the last write to the source's files
             (publisher/capture/sqlite/wake.py): the capture's wait for the commit.
``durable``  append began → the group commit that holds it made it durable and
             visible to feeds (one observation per entry).
``send``     visible → its feed message was written to the gRPC stream (one
             observation per message, for its first entry, only for entries made
             durable while the publisher ran: a catch-up's old entries have none).

Subscriber (``txrepl_subscription_stage_seconds{subscription, stage}``), one
observation per message or batch, not per entry (an observation costs ~0.35 µs and a
catch-up batch holds 64,000 entries):

``receive``  the publisher's ``Batch.sent_us`` → the message was read here (the
             network, gRPC and the subscriber's event loop).
``queue``    read → taken by an apply (waiting for the apply before it).
``apply``    the apply's planning: walk, decode, net effect (Spark or driver).
``commit``   the target transaction: its statements, the level row and COMMIT.
``total``    source commit of the batch's oldest entry → its target COMMIT returned.

Cross-process stages (``receive``, ``total`` and the publisher's ``capture``)
subtract two machines' wall clocks: exact on one machine (the benchmarks), as
good as the clocks' sync otherwise.  A negative difference (clock skew) is
recorded as 0.

Each daemon makes one :class:`StageLatency`; one made with ``registry=None`` is
exported once :meth:`~StageLatency.register`-ed, and keeps counts either way
(tests read them: how many entries or batches went through which stage).

Cost of an observation (issue 23: three per in-sync entry on the publisher, six per
one-entry batch on the subscriber).  It was a lock of ours (the child's cache and a
counter), then prometheus' child histogram: a scan of the bounds and two more locks,
1.4 µs in all.  Now each thread observes into cells of its own (bucket counts and a
sum per label pair) with no lock: only that thread writes them, and a reader (a
scrape, :attr:`~StageLatency.counts`) sums every thread's cells.  Reads under the
GIL: a cell's list element or sum is read whole; a thread's table of cells is copied
with ``dict.copy`` (one C call, never "changed size during iteration").  A scrape
that runs during an observation may see its bucket counted and not yet its sum (or
the other way round); the next scrape sees both: what prometheus' own histogram
allows too.  A thread's cells outlive it (its counts stay in the totals).
"""

from __future__ import annotations

import collections
import threading
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from common.metrics import METRICS

__all__ = ["BUCKETS", "PUBLISHER_STAGES", "SUBSCRIBER_STAGES", "StageLatency"]

PUBLISHER_STAGES = ("poll", "capture", "durable", "send")
SUBSCRIBER_STAGES = ("receive", "queue", "apply", "commit", "total")

# Fine below 10 ms (the goal is a p99 of 10 ms end to end), coarse above.
BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# The ``le`` labels, as prometheus' own histogram writes them.
_LE = [floatToGoString(b) for b in BUCKETS] + ["+Inf"]  # type: ignore[no-untyped-call]


class _Cell:
    """One thread's observations of one (label, stage): per-bucket (not cumulative)
    counts, the last one above every bound, and their sum."""

    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.total = 0.0


Cells = dict[tuple[str, str], _Cell]


class StageLatency(Collector):
    """One daemon's per-stage latency histogram (``name``, labelled ``label`` and ``stage``)."""

    def __init__(self, name: str, label: str, registry: Any = None) -> None:
        kind, labels, doc = METRICS[name]
        assert kind == "histogram", name
        assert labels == (label, "stage"), name
        self.name = name
        self._doc = doc
        self._label = label
        self._local = threading.local()  # .cells: this thread's Cells
        self._threads: list[Cells] = []  # every thread's, appended under _lock
        self._lock = threading.Lock()
        if registry is not None:  # None: unregistered until register()
            registry.register(self)

    def register(self, registry: Any) -> None:
        """Export the histogram from ``registry`` (a daemon's, made after this)."""
        registry.register(self)

    def observe(self, key: str, stage: str, seconds: float) -> None:
        try:
            cells: Cells = self._local.cells
        except AttributeError:
            cells = self._local.cells = {}
            with self._lock:
                self._threads.append(cells)
        cell = cells.get((key, stage))
        if cell is None:
            cell = cells[key, stage] = _Cell()
        if seconds > 0:
            cell.buckets[bisect_left(BUCKETS, seconds)] += 1
            cell.total += seconds
        else:  # a negative difference is clock skew: 0 (the module docstring)
            cell.buckets[0] += 1

    def _merged(self) -> dict[tuple[str, str], tuple[list[int], float]]:
        """Every thread's cells summed: (label, stage) → (bucket counts, sum)."""
        with self._lock:
            threads = list(self._threads)
        out: dict[tuple[str, str], tuple[list[int], float]] = {}
        for cells in threads:
            for k, cell in cells.copy().items():
                got = out.get(k)
                if got is None:
                    out[k] = (list(cell.buckets), cell.total)
                else:
                    buckets = [a + b for a, b in zip(got[0], cell.buckets, strict=True)]
                    out[k] = (buckets, got[1] + cell.total)
        return out

    @property
    def counts(self) -> collections.Counter[tuple[str, str]]:
        """(label value, stage) → observations so far (tests read these)."""
        return collections.Counter({k: sum(b) for k, (b, _) in self._merged().items()})

    def count(self, key: str, stage: str) -> int:
        return self.counts[key, stage]

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self._doc, labels=[self._label, "stage"])

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self._doc, labels=[self._label, "stage"])
        for (key, stage), (buckets, total) in sorted(self._merged().items()):
            running, cumulative = 0, []
            for le, n in zip(_LE, buckets, strict=True):
                running += n
                cumulative.append((le, float(running)))
            family.add_metric([key, stage], cumulative, total)
        yield family
