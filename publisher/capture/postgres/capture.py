"""PostgresCapture: the capture core plus its streaming loop with reconnects.

``run(pubs, halt)`` streams committed transactions into the publications until
``halt`` is set, opening a new :class:`~publisher.capture.postgres._session.Session`
after each lost connection (with :class:`common.backoff.Backoff`), and raising
SourceError when the source is reachable but can no longer be captured.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import psycopg
import psycopg2
import structlog

from common.backoff import Backoff
from publisher.capture.postgres._core import CaptureCore, Plugin
from publisher.capture.postgres._session import Session
from publisher.errors import SourceError
from publisher.publication import Publication

__all__ = ["Plugin", "PostgresCapture"]

log = structlog.get_logger(__name__)

# 0.2 s, doubling, at most 10 s between reconnects of the stream.
RECONNECT = Backoff(initial_s=0.2, max_s=10.0, jitter=0.0)


class PostgresCapture(CaptureCore):
    """Installs capture on a PostgreSQL source and streams its transactions into logs."""

    # -- running ------------------------------------------------------------------

    def run(self, pubs: Sequence[Publication], halt: threading.Event) -> None:
        """Stream committed transactions into ``pubs`` until ``halt`` is set.

        Connection losses are retried with backoff; a source that can no longer be
        captured (slot invalidated, wal_level changed) raises SourceError.
        """
        self._setup()
        failures = 0
        while not halt.is_set():
            session = Session(self, pubs, halt)
            try:
                session.run()
                return
            except (psycopg2.Error, psycopg.Error) as e:
                self.health.failed(e)
                self._check_permanent()
                log.warning("capture stream lost; reconnecting", error=str(e).strip())
            finally:
                session.close()
            failures += 1
            halt.wait(RECONNECT.delay(failures))

    def _check_permanent(self) -> None:
        """Raise SourceError if the source is reachable but cannot be captured."""
        try:
            self._admin()
        except SourceError:
            return  # unreachable: a restart or a network blip, retried
        try:
            self.check()
        except (psycopg.OperationalError, psycopg.InterfaceError):
            with self._lock:
                if self._admin_conn is not None:
                    self._admin_conn.close()
                    self._admin_conn = None
