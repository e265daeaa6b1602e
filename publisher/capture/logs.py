"""What every log-based capture does with its publication logs (PostgreSQL, MariaDB).

:class:`Flusher` makes a stream's appends durable, and visible to feeds, in rounds
while the stream decodes on (group commit across transactions: one fsync no longer
costs every transaction, and nothing is sent that is not durable).
:func:`last_before` finds the seq a snapshot taken at a source position is aligned
with.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog

from common.rpc import txrepl_pb2 as pb
from publisher.log import Log, LogError
from publisher.publication import Publication

__all__ = ["Flusher", "last_before"]

log = structlog.get_logger(__name__)


class Flusher(threading.Thread):
    """Makes a session's appends durable, and visible to feeds, while it decodes on.

    :meth:`kick` after an append; each round flushes every log (a no-op for a log with
    nothing pending), taking along whatever was appended during the previous fsync.
    A failed log stops the flusher with ``error`` set; the session raises it.
    """

    def __init__(self, logs: Sequence[Log], *, name: str = "txrepl-pg-capture-flush") -> None:
        super().__init__(name=name, daemon=True)
        self.logs = list(logs)
        self.error: LogError | None = None
        self._kicked = threading.Event()
        self._stopping = False

    def kick(self) -> None:
        # Set already (a round is due): nothing to do, and no lock taken.  Seeing it
        # set before the flusher clears it is safe: its round starts after the clear,
        # so after the append this kick follows.
        if not self._kicked.is_set():
            self._kicked.set()

    def stop(self) -> None:
        self._stopping = True
        self._kicked.set()
        if self.is_alive():
            self.join()

    def run(self) -> None:
        while True:
            self._kicked.wait()
            self._kicked.clear()
            if self._stopping:
                return
            try:
                for lg in self.logs:
                    lg.flush()
            except LogError as e:
                self.error = e
                log.error("capture: publication log flush failed", error=str(e))
                return


def last_before(pub: Publication, lsn: int) -> int:
    """The highest seq whose entry's source position is below ``lsn``.

    Positions never decrease along a log (commit LSNs in commit order; an install
    snapshot's ``C - 2``/``C - 1`` sit between the commits before and after ``C``;
    a ``Publish`` entry repeats the current position), so this walks back from the
    head over the entries appended since the stream passed ``lsn`` (usually none).
    The seq returned is a group's last (common/fragments.py): the fragments before
    it carry the position before their transaction, which may be below ``lsn``
    while the transaction commits after it.
    """
    log_ = pub.log
    seq = log_.head
    while seq >= max(1, log_.first_seq):
        (payload,) = log_.read(seq, max_entries=1)
        entry = pb.Entry.FromString(payload)
        if int(entry.source_position or 0) < lsn and not entry.continued:
            break
        seq -= 1
    return seq
