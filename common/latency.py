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
observation per message or batch, not per entry (an observation costs ~1 µs and a
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
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from prometheus_client import Histogram

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


class StageLatency:
    """One daemon's per-stage latency histogram (``name``, labelled ``label`` and ``stage``)."""

    def __init__(self, name: str, label: str, registry: Any = None) -> None:
        kind, labels, doc = METRICS[name]
        assert kind == "histogram", name
        assert labels == (label, "stage"), name
        self.name = name
        # registry None: unregistered until register() (counts are kept either way).
        self._hist = Histogram(name, doc, [label, "stage"], buckets=BUCKETS, registry=registry)
        self._children: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()  # observations come from several threads
        #: (label value, stage) → observations so far (tests read these).
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def register(self, registry: Any) -> None:
        """Export the histogram from ``registry`` (a daemon's, made after this)."""
        registry.register(self._hist)

    def observe(self, key: str, stage: str, seconds: float) -> None:
        with self._lock:
            child = self._children.get((key, stage))
            if child is None:
                child = self._children[key, stage] = self._hist.labels(key, stage)
            self.counts[key, stage] += 1
        child.observe(seconds if seconds > 0 else 0.0)

    def count(self, key: str, stage: str) -> int:
        return self.counts[key, stage]
