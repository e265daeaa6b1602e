"""A publication at run time: its log, its settings, and the one append path.

Every append to a publication (capture or the ``Publish`` RPC) goes through
:meth:`Publication.append` under one lock, which also keeps the capture
position: the ``source_position`` of the newest durable entry.  An entry
appended through ``Publish`` carries the current capture position too, so the
log's last entry always tells capture where to resume after a restart.
"""

from __future__ import annotations

import threading
import time

from common.rpc import txrepl_pb2 as pb
from publisher.config import PublicationConfig
from publisher.log import Log

__all__ = ["Publication"]


class Publication:
    def __init__(self, config: PublicationConfig, log: Log) -> None:
        self.config = config
        self.name = config.name
        self.log = log
        self._lock = threading.Lock()
        self.position = self._position_from_log()
        self.last_commit_time = time.time()

    def _position_from_log(self) -> int:
        if self.log.head == 0 or self.log.head < self.log.first_seq:
            # An empty log (or one fully purged): the position is in the log dir's
            # entries no more; capture starts from what the source installation says.
            return 0
        (payload,) = self.log.read(self.log.head, max_entries=1)
        entry = pb.Entry.FromString(payload)
        return int(entry.source_position or 0)

    def append(self, entry: pb.Entry, position: int | None = None, *, wait: bool = True) -> int:
        """Append one entry; returns its seq.  ``position``: the capture position it reaches.

        ``wait=False``: do not wait for durability (see :meth:`Log.append`); the entry
        is visible to feeds after the log's next flush.
        """
        with self._lock:
            if position is not None:
                entry.source_position = str(position)
            else:
                entry.source_position = str(self.position)
            if not entry.commit_time_us:
                entry.commit_time_us = int(time.time() * 1_000_000)
            seq = self.log.append([entry.SerializeToString()], wait=wait)
            if position is not None:
                self.position = position
            self.last_commit_time = entry.commit_time_us / 1_000_000
            return seq

    def advance(self, position: int) -> None:
        """Move the capture position past rows that held nothing for this publication."""
        with self._lock:
            self.position = max(self.position, position)
