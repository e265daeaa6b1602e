"""The daemon's SparkSession, started when a batch first needs it (or beside the
subscriptions), never before them.

Issue 23 (start-up, and a light subscriber): an in-sync apply needs no Spark job
(batches below ``spark_min_rows`` get their net effect in the driver, ``_small.py``),
yet a JVM's start costs 6-10 s of wall time, about 8 s of CPU on 2 cores with its
warm-up jobs, and some 400 MB of memory.  :class:`LazySpark` stands where the session
is expected.  ``[spark] start`` chooses when the JVM starts:

* ``on_demand`` (the default): once batches of at least ``spark_min_rows`` row
  changes have kept coming for ``start_after_s`` (below), or at the first use of the
  session (a table with transforms or history, a snapshot load, a JDBC stager).  A
  subscriber that stays in sync never starts one.
* ``at_start``: at once, in a thread, while the subscriptions connect (a catch-up
  then finds the JVM warm).

States of one start: idle → starting → started (the session, warmed) | failed (the
error, raised at every later use, and logged once when it happens).  ``idle`` only
in ``on_demand``.  Rules that keep a batch from ever waiting on a start it does not
need:

* A *use* (an attribute read: a Spark job, a JDBC stager, a snapshot loader) begins
  the start when idle and waits for it.
* :func:`spark_ready` tells the planner whether a job can run now; when the session
  is idle it begins the start and answers False, and the planner computes that
  batch's net effect in the driver, as it does for a small batch (the same result,
  ``_small.py``).  So a catch-up never waits for the JVM: its first batches are
  planned in the driver while the JVM starts and warms, the next ones in Spark.
  ``spark_min_rows = 0`` (every batch in Spark) waits instead.
* Closing an idle session starts nothing.

When a big batch's demand starts the JVM (``on_demand``): the rule of renting skis.
A catch-up's batches planned in the driver cost nothing to start; the JVM costs some
5 s of wall time and 8 s of CPU (on two cores, taken from the catch-up itself) before
its first job, and on one machine its jobs are no faster than the driver.  So it
only pays for a catch-up that would outlast its start: the JVM is begun when big
batches (those :func:`spark_ready` is asked about) have been asked for over
``start_after_s`` (default 5 s, about the start's own time), each within
``start_after_s`` of the one before (a gap that long ends the demand; the next big
batch begins a new one).  A catch-up shorter than that (W1's 235,000 row changes:
about 1.5 s) never starts a JVM; a longer one pays at most twice what either choice
alone would have cost, the classic bound of the rule.  ``start_after_s = 0``: the
first big batch begins the start (the rule before).

Attributes set on the proxy itself (the engine's ``_txrepl_warm`` mark) stay on the
proxy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LazySpark", "spark_ready", "spark_starting"]

log = structlog.get_logger(__name__)


class LazySpark:
    """A SparkSession started in a thread, at once or at first need; a use waits for it."""

    def __init__(
        self,
        start: Callable[[], SparkSession],
        *,
        at_once: bool = True,
        start_after_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._start = start
        self.start_after_s = start_after_s
        self._clock = clock
        self._wanted_since: float | None = None  # the current demand's first big batch
        self._wanted_last = 0.0
        self._done = threading.Event()
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if at_once:
            self.begin()

    def begin(self) -> None:
        """Start the JVM in a thread, unless it was already begun."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name="txrepl-spark-start", daemon=True
            )
            log.info("spark session starting")
            self._thread.start()

    def wanted(self) -> None:
        """A big batch would run a Spark job: begin the start once big batches have been
        asked for over ``start_after_s`` (the module docstring's rule)."""
        if not self.idle:
            return
        now = self._clock()
        with self._lock:
            since = self._wanted_since
            if since is None or now - self._wanted_last > self.start_after_s:
                since = self._wanted_since = now  # a new demand
            self._wanted_last = now
        if now - since >= self.start_after_s:
            self.begin()

    def _run(self) -> None:
        began = time.monotonic()
        try:
            self._session = self._start()
            log.info("spark session started", seconds=round(time.monotonic() - began, 3))
        except BaseException as e:  # kept for the first use, which raises it
            self._error = e
            log.error("Spark session did not start", error=f"{type(e).__name__}: {e}")
        finally:
            self._done.set()

    @property
    def idle(self) -> bool:
        """True while nothing has asked for the session yet (``on_demand``)."""
        return self._thread is None

    @property
    def starting(self) -> bool:
        """True until the session started (or failed to), idle included."""
        return not self._done.is_set()

    @property
    def failed(self) -> bool:
        return self._done.is_set() and self._error is not None

    def session(self) -> SparkSession:
        """The session, once started (begins the start, waits); its error if it failed."""
        self.begin()
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._session is not None
        return self._session

    def __getattr__(self, name: str) -> Any:
        # Only for names not on the proxy itself: the session's.  Dunders and the
        # engine's own marks (``_txrepl_*``, set on the proxy) never wait.
        if name.startswith(("__", "_txrepl")) or name in (
            "_start",
            "_done",
            "_session",
            "_error",
            "_thread",
            "_lock",
            "_clock",
            "_wanted_since",
            "_wanted_last",
            "start_after_s",
        ):
            raise AttributeError(name)
        return getattr(self.session(), name)


def spark_starting(spark: object) -> bool:
    """True when ``spark`` is a :class:`LazySpark` whose session is not there yet."""
    return isinstance(spark, LazySpark) and spark.starting


def spark_ready(spark: object) -> bool:
    """Whether a Spark job on ``spark`` would run without waiting for the JVM.

    A :class:`LazySpark` not started yet is not ready, and told that a big batch
    wants it (:meth:`LazySpark.wanted`: it begins once the demand lasts); a failed
    one is "ready": the job raises the start's error.
    """
    if not isinstance(spark, LazySpark):
        return True
    if spark.starting:
        spark.wanted()
        return False
    return True
