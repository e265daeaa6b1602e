"""A publication at run time: its log, its settings, and the one append path.

Every append to a publication (capture or the ``Publish`` RPC) goes through
:meth:`Publication.append` under one lock, which also keeps the capture
position: the ``source_position`` of the newest durable entry.  An entry
appended through ``Publish`` carries the current capture position too, so the
log's last entry always tells capture where to resume after a restart.

Groups (``common/fragments.py``, P1-P3): capture appends a large group of
transactions as fragments with ``grouped=True``; while a group is open (its
last appended fragment has ``continued``) other appends wait for it to close.
Origins (``common/origin.py``, R1): an entry that capture did not give an origin
(the source's own changes, ``Publish``) gets the source's node.

A group left open (a restart, a capture failure) is closed by
:meth:`abort_group`: one empty entry with ``aborted`` set, so subscribers apply
none of it and capture carries it again from its resume point.

Stage latency (common/latency.py), once :meth:`Publication.measure` is called:
``capture`` at each append; ``durable`` when the head passes the entry (a log
listener, or the append itself when it waited for its fsync: both settle the
pending appends under ``_stage_lock``, in seq order); the time each entry became
durable is kept for the last ``_DURABLE_KEPT`` seqs, which the feed reads for
``send`` (:meth:`Publication.sent`).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence

from common import trace as _trace
from common.latency import StageLatency
from common.rpc import txrepl_pb2 as pb
from publisher.config import PublicationConfig
from publisher.log import Log
from publisher.shaping import Shaper, shapings

__all__ = ["Encoded", "Publication", "append_in_order"]

# An entry as its fields: its ops' bytes, position, commit time, origin and sequence
# positions (Publication.append_encoded_many).
Encoded = tuple[bytes, int, int, str, Sequence[pb.SequencePosition]]

_DURABLE_KEPT = 8192  # seqs whose durable time the feeds may still ask for
_TAILS_KEPT = 64  # origins whose entry tail is kept (_encoded): the nodes of a topology


class Publication:
    def __init__(self, config: PublicationConfig, log: Log, *, node: str = "") -> None:
        self.config = config
        self.node = node  # the source's node: the origin of its own changes (common/origin.py)
        self.name = config.name
        self.log = log
        self.shaper = Shaper(shapings(config.filter, config.columns))
        self._lock = threading.Condition()
        # Held by a retention pass and by a subscriber's admission (feed.py): a pass
        # never purges from registry levels read before a subscriber was registered.
        self.retention_lock = threading.Lock()
        self._open: int | None = None  # fragment index of an open group's last fragment
        self.position = self._position_from_log()
        self.last_commit_time = time.time()
        # Set by a capture while it reads a backlog (PostgreSQL: commits sent by the
        # server a second or more after they were made; capture/postgres/_session.py):
        # feeds neither go in sync nor are cut for their queue meanwhile, the head not
        # being live (feed.py).
        self.catching_up = False
        self.stages: StageLatency | None = None
        self._stage_lock = threading.Lock()
        self._appended_at: collections.deque[tuple[int, float]] = collections.deque()
        self._durable: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=_DURABLE_KEPT
        )
        self._tails: dict[str, bytes] = {}  # origin → an entry alone's bytes after its ops
        self.abort_group()  # left open by a crash between two fragments (P3)

    # -- stage latency ------------------------------------------------------------------

    def measure(self, stages: StageLatency) -> None:
        """Observe this publication's ``capture``, ``durable`` and ``send`` stages."""
        self.stages = stages
        self.log.add_listener(self._on_head)

    def _on_head(self, head: int) -> None:
        with self._stage_lock:
            self._settle(head)

    def _settle(self, head: int) -> None:
        """Appends at or below ``head`` are durable now (``_stage_lock`` held)."""
        stages, pending = self.stages, self._appended_at
        if stages is None or not pending or pending[0][0] > head:
            return
        now = time.time()
        tr = _trace.TRACE
        while pending and pending[0][0] <= head:
            seq, began = pending.popleft()
            stages.observe(self.name, "durable", now - began)
            self._durable.append((seq, now))
            if tr is not None:
                tr.mark(seq, "durable", int(now * 1_000_000))

    def sent(self, seq: int) -> None:
        """A feed wrote entry ``seq`` to its stream: its ``send`` stage, if still known."""
        stages = self.stages
        if stages is None:
            return
        with self._stage_lock:
            kept = self._durable
            if not kept:
                return
            i = seq - kept[0][0]
            if not 0 <= i < len(kept):
                return
            at_seq, durable_at = kept[i]
        if at_seq == seq:
            stages.observe(self.name, "send", time.time() - durable_at)

    def traced_send(self, trace: _trace.Trace, first: int, last: int) -> int:
        """A feed is about to send seqs ``first..last`` (tracing on): settle their
        ``durable`` first if the log's listener has not yet (it runs just after the
        head moved: a feed may read the entries in between), then stamp and trace
        ``sent``; returns the stamp (µs) for ``Batch.sent_us``."""
        if self.stages is not None:
            with self._stage_lock:
                self._settle(min(last, self.log.head))
        sent_us = int(time.time() * 1_000_000)
        trace.span(first, last - first + 1, "sent", sent_us)
        trace.event("sent", first=first, entries=last - first + 1)
        return sent_us

    def _position_from_log(self) -> int:
        if self.log.head == 0 or self.log.head < self.log.first_seq:
            # An empty log (or one fully purged): the position is in the log dir's
            # entries no more; capture starts from what the source installation says.
            return 0
        (payload,) = self.log.read(self.log.head, max_entries=1)
        entry = pb.Entry.FromString(payload)
        if entry.continued:
            self._open = entry.fragment
        return int(entry.source_position or 0)

    @property
    def group_open(self) -> bool:
        return self._open is not None

    def append(
        self,
        entry: pb.Entry,
        position: int | None = None,
        *,
        wait: bool = True,
        grouped: bool = False,
    ) -> int:
        """Append one entry; returns its seq.  ``position``: the capture position it reaches.

        ``wait=False``: do not wait for durability (see :meth:`Log.append`); the entry
        is visible to feeds after the log's next flush.  ``grouped``: a fragment of the
        capture's open group (or its first); any other append waits while a group is
        open, so a group's fragments are consecutive seqs.
        """
        with self._lock:
            self._admit(grouped, entry.fragment)
            entry.source_position = str(position if position is not None else self.position)
            began = time.time()
            entry.commit_time_us = self._stamp(entry.commit_time_us, began)
            if not entry.origin:  # made here, not applied by txrepl (common/origin.py, R1)
                entry.origin = self.node
            self.shaper.entry(entry)  # filters and column lists: before the log
            seq = self.log.append([entry.SerializeToString()], wait=wait)
            opened = entry.fragment if entry.continued else None
            return self._booked(seq, began, position, entry.commit_time_us, opened)

    def append_encoded(
        self,
        ops: bytes,
        position: int,
        *,
        commit_time_us: int,
        origin: str = "",
        sequences: Sequence[pb.SequencePosition] = (),
        wait: bool = True,
        grouped: bool = False,
        continued: bool = False,
        fragment: int = 0,
    ) -> int:
        """``append(entry, position, wait=wait, grouped=grouped)`` of the Entry of these
        fields, its ops given as their bytes within it (``1a len Op`` each, as a capture
        writes them: capture/postgres/_pgwire.py, capture/sqlite/entries.py).  The bytes
        logged are the same; the Entry is only built (parsed) when a shaping of this
        publication must see it.  The fields are written in field-number order
        (commit_time_us 1, source_position 2, ops 3, continued 4, fragment 5, origin 7,
        sequences 8), the order upb serializes an Entry in.
        """
        if self.shaper:
            entry = pb.Entry.FromString(ops)
            entry.commit_time_us = commit_time_us
            entry.origin = origin
            entry.sequences.extend(sequences)
            entry.continued, entry.fragment = continued, fragment
            return self.append(entry, position, wait=wait, grouped=grouped)
        with self._lock:
            self._admit(grouped, fragment)
            began = time.time()
            commit_time_us = self._stamp(commit_time_us, began)
            data = self._encoded(
                ops, position, commit_time_us, origin, sequences, continued, fragment
            )
            seq = self.log.append([data], wait=wait)
            opened = fragment if continued else None
            return self._booked(seq, began, position, commit_time_us, opened)

    def append_encoded_many(self, items: Sequence[Encoded]) -> int:
        """``append_encoded(ops, position, commit_time_us=, origin=, sequences=,
        wait=False)`` of each item (ops, position, commit time, origin, sequences) in
        order, as consecutive seqs, under one lock and in one ``Log.append``: capture
        reading a backlog (capture/postgres/_session.py).  Returns the first seq."""
        if not items:
            raise ValueError("append_encoded_many needs at least one entry")
        if self.shaper:
            seqs = [
                self.append_encoded(
                    ops, position, commit_time_us=t, origin=origin, sequences=sq, wait=False
                )
                for ops, position, t, origin, sq in items
            ]
            return seqs[0]
        with self._lock:
            self._admit(False, 0)
            began = time.time()
            stamp, encoded = self._stamp, self._encoded
            data = []
            for ops, position, t, origin, sq in items:
                t = stamp(t, began)
                data.append(encoded(ops, position, t, origin, sq))
            seq = self.log.append(data, wait=False)
            tr = _trace.TRACE
            if tr is not None:
                for i, item in enumerate(items):
                    tr.mark(seq + i, "commit", item[2] or int(began * 1_000_000))
                    tr.mark(seq + i, "appended", int(began * 1_000_000))
            return self._booked(seq, began, items[-1][1], t, None, count=len(data))

    def _encoded(
        self,
        ops: bytes,
        position: int,
        commit_time_us: int,
        origin: str,
        sequences: Sequence[pb.SequencePosition],
        continued: bool = False,
        fragment: int = 0,
    ) -> bytes:
        """The logged bytes of an Entry of these fields around ``ops``' bytes, in
        field-number order (:meth:`append_encoded`)."""
        head = pb.Entry(commit_time_us=commit_time_us, source_position=str(position))
        origin = origin or self.node
        if continued or fragment or sequences:
            tail = pb.Entry(
                continued=continued, fragment=fragment, origin=origin, sequences=sequences
            ).SerializeToString()
        else:  # an entry alone: its tail is its origin's alone, made once (1 µs an entry)
            kept = self._tails.get(origin)
            if kept is not None:
                tail = kept
            else:
                if len(self._tails) >= _TAILS_KEPT:
                    self._tails.clear()
                tail = self._tails[origin] = pb.Entry(origin=origin).SerializeToString()
        return head.SerializeToString() + ops + tail

    def _admit(self, grouped: bool, fragment: int) -> None:
        """Wait (``_lock`` held) until this append may enter the log: any append but a
        group's next fragment waits while a group is open (common/fragments.py, P1)."""
        if not grouped:
            self._lock.wait_for(lambda: self._open is None)
        elif self._open is not None and fragment != self._open + 1:
            raise ValueError(f"fragment {fragment} does not follow the open group's {self._open}")

    def _stamp(self, commit_time_us: int, began: float) -> int:
        """An entry's commit time (now if it has none); observes the ``capture`` stage."""
        if not commit_time_us:
            return int(began * 1_000_000)
        if self.stages is not None:
            self.stages.observe(self.name, "capture", began - commit_time_us / 1e6)
        return commit_time_us

    def _booked(
        self,
        seq: int,
        began: float,
        position: int | None,
        commit_time_us: int,
        opened: int | None,
        count: int = 1,
    ) -> int:
        """Book an append of ``count`` entries from ``seq`` (``_lock`` held); ``opened``:
        the fragment index of a group it leaves open; the last entry's position and
        commit time."""
        if self.stages is not None:
            with self._stage_lock:
                if count == 1:
                    self._appended_at.append((seq, began))
                else:
                    self._appended_at.extend((seq + i, began) for i in range(count))
                self._settle(self.log.head)  # an append that waited is durable already
        tr = _trace.TRACE
        if tr is not None and count == 1:
            tr.mark(seq, "commit", commit_time_us)
            tr.mark(seq, "appended", int(began * 1_000_000))
        if position is not None:
            self.position = position
        self.last_commit_time = commit_time_us / 1_000_000
        self._open = opened
        if opened is None:
            self._lock.notify_all()
        return seq

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[int]:
        """Hold every other append (no group is open meanwhile); yields the head.

        Appends of the holder's own thread go through (the lock is re-entrant).
        """
        with self._lock:
            self._lock.wait_for(lambda: self._open is None)
            yield self.log.head

    def abort_group(self) -> None:
        """Close a group left open with an ``aborted`` entry (no ops); no-op if none is open.

        Its ``source_position`` is the group's resume point (fragments before the
        last carry it), so capture carries the group again after it.
        """
        with self._lock:
            if self._open is None:
                return
            fragment = self._open + 1
        entry = pb.Entry(aborted=True, fragment=fragment)
        self.append(entry, grouped=True)

    def advance(self, position: int) -> None:
        """Move the capture position past rows that held nothing for this publication."""
        with self._lock:
            self.position = max(self.position, position)


def append_in_order(queued: Sequence[tuple[Publication, Encoded]]) -> None:
    """Append ``queued`` entries, each publication's in one ``append_encoded_many``
    call, each publication's in commit order (capture/postgres/_session.py)."""
    if not queued:
        return
    pub = queued[0][0]
    if all(p is pub for p, _ in queued):
        pub.append_encoded_many([item for _, item in queued])
        return
    by_pub: dict[str, tuple[Publication, list[Encoded]]] = {}
    for p, item in queued:
        by_pub.setdefault(p.name, (p, []))[1].append(item)
    for p, items in by_pub.values():
        p.append_encoded_many(items)
