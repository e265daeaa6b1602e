"""The daemon's SparkSession, started beside the subscriptions instead of before them.

Issue 23 (start-up): an in-sync apply needs no Spark job (batches below
``spark_min_rows`` get their net effect in the driver, ``_small.py``), yet the JVM's
start (6-10 s here) and the warm-up jobs used to come before any subscription
connected.  :class:`LazySpark` stands where the session is expected: the JVM starts
in a thread at once, and the first *use* of the session (an attribute read: a
Spark job, a JDBC stager, a snapshot loader, ``stop``) waits for it.  What never
touches the session (the small apply path, the writer, the stream) goes on
meanwhile.

State machine of one start: starting → started (the session) | failed (the error,
raised at every later use, and logged once when it happens).  Attributes set on
the proxy itself (the engine's ``_txrepl_warm`` mark) stay on the proxy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LazySpark", "spark_starting"]

log = structlog.get_logger(__name__)


class LazySpark:
    """A SparkSession being started in a thread; any attribute read waits for it."""

    def __init__(self, start: Callable[[], SparkSession]) -> None:
        self._start = start
        self._done = threading.Event()
        self._session: SparkSession | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="txrepl-spark-start", daemon=True)
        self._thread.start()

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
    def starting(self) -> bool:
        """True until the session started (or failed to)."""
        return not self._done.is_set()

    @property
    def failed(self) -> bool:
        return self._done.is_set() and self._error is not None

    def session(self) -> SparkSession:
        """The session, once started (waits); the start's error if it failed."""
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
        ):
            raise AttributeError(name)
        return getattr(self.session(), name)


def spark_starting(spark: object) -> bool:
    """True when ``spark`` is a :class:`LazySpark` whose session is not there yet."""
    return isinstance(spark, LazySpark) and spark.starting
