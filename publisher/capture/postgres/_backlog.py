"""Whether PostgreSQL capture is reading a backlog (``Publication.catching_up``).

The feeds (publisher/feed.py) neither go in sync nor cut for the queue while the
head is not live.  Capture reads a backlog from a commit the server sent
:data:`BACKLOG_S` or more after it was made (both times are the server's clock: no
skew) until one it sent within :data:`LIVE_S`, or :data:`BACKLOG_S` with nothing to
read (not 0.2 s: a walsender starved of a core on a loaded machine pauses that long
inside a backlog).  Checked at every commit while live, every :data:`CHECK_EVERY`-th
in a backlog (the send time is a datetime made on access, ~1 us).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from publisher.publication import Publication

__all__ = ["BACKLOG_S", "CHECK_EVERY", "LIVE_S", "Backlog"]

BACKLOG_S = 1.0
LIVE_S = 0.25
CHECK_EVERY = 64


class Backlog:
    """The flag of one session's publications, set and cleared by what capture reads."""

    def __init__(self, pubs: Sequence[Publication]) -> None:
        self.pubs = pubs
        self.on = False
        self.dry = 0.0  # since when reads have found nothing (0: the last one found one)

    def committed(self, count: int, msg: Any, commit_time_us: int) -> None:
        """Commit number ``count`` was read, in replication message ``msg``."""
        if self.on and count % CHECK_EVERY:
            return
        late = msg.send_time.timestamp() - commit_time_us / 1e6
        if late >= BACKLOG_S and not self.on:
            self._set(True)
        elif late < LIVE_S and self.on:
            self._set(False)

    def nothing_read(self) -> None:
        """A read found nothing: that long with nothing to read means live."""
        if self.on:
            now = time.monotonic()
            if not self.dry:
                self.dry = now
            elif now - self.dry >= BACKLOG_S:
                self._set(False)

    def clear(self) -> None:
        if self.on:
            self._set(False)

    def _set(self, on: bool) -> None:
        self.on = on
        for p in self.pubs:
            p.catching_up = on
