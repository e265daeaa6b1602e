"""Appending one group of source transactions as fragments (``common/fragments.py``).

A capture hands :class:`GroupWriter` the entries of one group (each at most
``max_entry_bytes``) as it builds them, and calls :meth:`GroupWriter.finish` at
the group's end.  The writer keeps the newest entry back until the next one (or
the end) comes, so it knows whether ``continued`` must be set: memory holds one
entry per publication, whatever the group's size.  Rules P1-P2: fragments are
appended with ``grouped=True`` (other appends wait), every one but the last
carries the group's resume point as its position.  :meth:`abort` is rule P3 on
the capture's error path.  :meth:`GroupWriter.add` takes an entry as a ``pb.Entry``
or as an :class:`EncodedEntry`, the bytes of its ops (logged around them by
``Publication.append_encoded``, never parsed; the SQLite capture's backlog).
"""

from __future__ import annotations

from typing import NamedTuple

from common.rpc import txrepl_pb2 as pb
from publisher.publication import Publication

__all__ = ["EncodedEntry", "GroupWriter"]


class EncodedEntry(NamedTuple):
    """An entry as the bytes of its ``ops`` field (``1a len Op`` each) and its fields."""

    ops: bytes
    commit_time_us: int
    origin: str = ""


class GroupWriter:
    """One publication's side of one group being captured."""

    def __init__(self, pub: Publication) -> None:
        self.pub = pub
        self.start = pub.position  # the resume point: where capture restarts the group
        self._pending: tuple[pb.Entry | EncodedEntry, int] | None = None
        self.fragments = 0  # appended so far

    def add(self, entry: pb.Entry | EncodedEntry, position: int) -> None:
        """The group's next entry, reaching capture ``position``."""
        if self._pending is not None:
            self._append(*self._pending, continued=True)
        self._pending = (entry, position)

    def finish(self, position: int) -> int:
        """The group ends at ``position``; returns the number of entries appended."""
        if self._pending is not None:
            entry, _ = self._pending
            self._pending = None
            self._append(entry, position, continued=False)
        elif position > self.pub.position:
            self.pub.advance(position)
        return self.fragments

    def abort(self) -> None:
        """Capture failed inside the group: close it in the log as abandoned (P3)."""
        self._pending = None
        self.pub.abort_group()

    def _append(self, entry: pb.Entry | EncodedEntry, position: int, *, continued: bool) -> None:
        at = position if not continued else self.start
        if isinstance(entry, EncodedEntry):
            self.pub.append_encoded(
                entry.ops,
                at,
                commit_time_us=entry.commit_time_us,
                origin=entry.origin,
                grouped=True,
                continued=continued,
                fragment=self.fragments,
            )
        else:
            if continued or self.fragments:
                entry.continued = continued
                entry.fragment = self.fragments
            self.pub.append(entry, position=at, grouped=True)
        self.fragments += 1
