"""The capture thread: runs a source's ``stream`` beside the daemon's event loop.

``Source.stream`` blocks and retries transient failures itself, so this thread
only starts it, carries the ``halt`` event that stops it, and stays alive
while capture does (the daemon's watchdog and health look at ``is_alive()``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from publisher.capture.source import Source
from publisher.publication import Publication

__all__ = ["CaptureThread"]


class CaptureThread(threading.Thread):
    """``source.stream(pubs, halt)`` in a daemon thread."""

    def __init__(self, source: Source, pubs: Sequence[Publication]) -> None:
        super().__init__(name=f"txrepl-capture-{source.dialect}", daemon=True)
        self.source = source
        self.pubs = list(pubs)
        self.halt = threading.Event()

    @property
    def entries(self) -> int:
        return self.source.entries

    def run(self) -> None:
        self.source.stream(self.pubs, self.halt)
