"""Between the stream and the apply: a bounded queue that coalesces batches.

Back-pressure: received batches wait in a bounded queue (``queue_batches``);
the receive loop blocks on a full queue (:meth:`Batcher.put`) and stops reading
the stream, so a slow apply shows at the publisher as a slow feed, never as
memory growth here.

Coalescing: a batch that arrives while the previous one has not been taken by
the apply yet (waiting for room in the queue, or queued) joins it (consecutive
seqs), up to 1/``queue_batches`` of the batch limits (``max_entries``,
``max_bytes``); only a full queue blocks the reading.  In sync the publisher
sends entries one by one as they commit, so without this an apply would get at
most ``queue_batches`` entries and fall behind a busy source however large
``max_entries`` is.

Memory: stays bounded by the same limits: the queue holds at most
``queue_batches`` items of at most ``max_entries / queue_batches`` entries and
``max_bytes / queue_batches`` bytes each (a larger incoming batch is queued in
pieces), plus the one item waiting for room: about ``max_bytes`` in all.

The apply takes work with :meth:`Batcher.gather`: everything that arrived while
the last apply ran, up to ``max_entries`` / ``max_bytes``.  ``None`` in the
queue ends the session (:meth:`end`, :meth:`drop`).

Natural batching (issue 23): ``gather`` never waits for more than what is
there.  An idle apply takes an entry the moment it is queued (one entry, one
target transaction, no timer); entries that arrive while an apply runs join
the newest untaken item (above) and go, all together, into the next apply.  So
batches grow with the load by themselves: one entry each at a trickle, as many
as arrived during the previous apply under a burst, and the limits bound them.
The ``[batch] max_delay_ms`` linger this replaces added up to 25 ms to every
in-sync entry for the sake of larger transactions that the load makes anyway
(docs/performance.md has the measurements).

Groups (``common/fragments.py``, rule S1): a batch ends only at a group's end,
so the level it commits never points inside a source transaction.  What
follows the last group end of a gathered batch is carried over to the next
(``_carry``, taken first).  A group larger than the limits on its own is
handed out in pieces within the limits, each but its last marked *open*: the
apply writes them into one target transaction held open until the group's
last fragment (``subscriber/apply/_pieces.py``).  So is a group still arriving
once :data:`PIECE_BYTES` of it wait and nothing more is queued: the apply works
on its fragments while the publisher builds the next ones, instead of starting
when the last one is in (a SQLite backlog of 235,000 W1 rows is one group of 13
fragments built over about 5 s).  The fragments of an aborted
group become empty entries (rule S2); when the group was being handed out in
pieces, the batch closing it starts again at the group's first seq, all empty,
so the apply drops what it held and moves the level past the group.
Reading the group fields costs a parse of an entry's tag stream (skipping its
ops, in C): done for the batch's last entries only, and for entries short
enough to be an ``aborted`` mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from common.fragments import EMPTY_ENTRY, mark
from subscriber.config import BatchConfig
from subscriber.errors import Interrupted
from subscriber.state import SubscriptionState

__all__ = ["PIECE_BYTES", "Batcher", "Received"]

# A group still arriving is handed out in pieces of at least this many bytes when
# nothing more is queued, rather than waiting for its last fragment: a backlog
# captured from SQLite as one group (several transactions read in chunks,
# publisher/capture/sqlite/source.py) is applied while the publisher still builds it.
PIECE_BYTES = 1024 * 1024


@dataclass
class Received:
    """Consecutive entries received, waiting to be applied."""

    first_seq: int
    entries: list[bytes]
    head: int
    received_at: float = field(default_factory=time.monotonic)
    size: int = 0  # bytes of the entries
    taken: bool = False  # by the apply loop: nothing may join it any more


class Batcher:
    """One session's queue from the receive loop (one writer) to the apply (one reader)."""

    def __init__(
        self, batch: BatchConfig, state: SubscriptionState, interrupted: asyncio.Event
    ) -> None:
        self.batch = batch
        self.state = state
        self._interrupted = interrupted
        self.queue: asyncio.Queue[Received | None] = asyncio.Queue(batch.queue_batches)
        self.room_entries = max(1, batch.max_entries // batch.queue_batches)
        self.room_bytes = max(1, batch.max_bytes // batch.queue_batches)
        self._last: Received | None = None  # the newest item, queued or waiting for room
        self._put: asyncio.Future[None] | None = None
        self._carry: Received | None = None  # entries after the last group end of a batch
        self._group_start: int | None = None  # of a group handed out in pieces, still open
        self.received_at = time.monotonic()  # of the oldest part of the last gathered batch

    # -- the receive side ----------------------------------------------------------

    async def put(
        self, first_seq: int, payloads: Sequence[bytes], head: int, consumer: asyncio.Task[None]
    ) -> bool:
        """Queue consecutive entries; False if ``consumer`` (the apply) ended first.

        Blocks while the queue is full: back-pressure onto the stream.
        """
        # A batch larger than an item (the publisher's batch_entries above
        # max_entries / queue_batches) is queued in pieces, so an apply never
        # takes more than max_entries.
        room = self.room_entries
        payloads = list(payloads)
        for i in range(0, len(payloads), room):
            chunk = payloads[i : i + room]
            size = sum(map(len, chunk))
            last = self._last
            if (
                last is not None
                and not last.taken
                and len(last.entries) + len(chunk) <= room
                and last.size + size <= self.room_bytes
            ):
                # Not taken by the apply yet: ride along (single threaded, so the
                # apply cannot take it meanwhile).
                last.entries.extend(chunk)
                last.head = head
                last.size += size
                continue
            if self._put is not None and not await self._put_done(self._put, consumer):
                return False
            self._last = Received(first_seq + i, chunk, head, size=size)
            try:  # no task when there is room (the common case: one per received batch)
                self.queue.put_nowait(self._last)
                self._put = None
            except asyncio.QueueFull:
                self._put = asyncio.ensure_future(self.queue.put(self._last))
        return True

    async def _put_done(self, put: asyncio.Future[None], consumer: asyncio.Task[None]) -> bool:
        """Wait until ``put`` has queued its item; False if the apply ended first."""
        if put.done():
            return True
        intr = asyncio.ensure_future(self._interrupted.wait())
        waits: set[asyncio.Future[Any]] = {put, consumer, intr}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            intr.cancel()
        if put in done:
            return True
        put.cancel()
        if self._interrupted.is_set():
            raise Interrupted()
        return False

    def close(self) -> None:
        """The receive loop is ending: what was not queued is resent after the next Hello."""
        if self._put is not None and not self._put.done():
            self._put.cancel()

    # -- the apply side ------------------------------------------------------------

    def pending(self) -> bool:
        return self._carry is not None or not self.queue.empty()

    async def gather(self) -> tuple[int, list[bytes], int, bool] | None:
        """The next batch to apply, or None once the session ends.

        Returns (first seq, entries, bytes, open): ``open`` when the batch is a piece
        of a group over the limits that the next batch goes on with.

        Natural batching: waits only while nothing at all is queued; then takes
        everything that arrived while the last apply ran, up to the limits, and
        returns at once (no timer).  :attr:`received_at` is then the arrival
        time (``time.monotonic``) of the batch's oldest part.
        """
        queue = self.queue
        item: Received | None
        if self._carry is not None:
            item, self._carry = self._carry, None
        else:
            item = await queue.get()
        if item is None:
            return None
        item.taken = True
        self.received_at = item.received_at
        first_seq = item.first_seq
        payloads = list(item.entries)
        size = item.size
        while (
            len(payloads) < self.batch.max_entries
            and size < self.batch.max_bytes
            and not queue.empty()
        ):
            nxt = queue.get_nowait()
            if nxt is None:
                queue.put_nowait(None)
                break
            nxt.taken = True
            payloads.extend(nxt.entries)
            size += nxt.size
        cut = _group_cut(payloads)
        while cut == 0 and len(payloads) < self.batch.max_entries and size < self.batch.max_bytes:
            if size >= PIECE_BYTES and queue.empty():
                break  # a group still arriving: apply what is here while the rest comes
            # The first group is not all here yet: wait for more, up to the limits.
            more = await queue.get()
            if more is None:
                queue.put_nowait(None)
                return None  # resent from the level (a group start) after the next Hello
            more.taken = True
            payloads.extend(more.entries)
            size += more.size
            cut = _group_cut(payloads)
        if cut == 0:
            # The group alone is over the limits, or still arriving: this piece is applied
            # inside the group's open target transaction (subscriber/apply/_pieces.py).
            if self._group_start is None:
                self._group_start = first_seq
            return first_seq, payloads, size, True
        if cut < len(payloads):
            rest = payloads[cut:]
            rest_size = sum(map(len, rest))
            self._carry = Received(
                first_seq + cut, rest, self.state.head, received_at=self.received_at, size=rest_size
            )
            self._carry.taken = True
            del payloads[cut:]
            size -= rest_size
        group_start, self._group_start = self._group_start, None
        if group_start is not None and _first_group_aborted(payloads):
            # The group held open since group_start was aborted: from its start, as
            # empty entries (the apply drops what it held).
            payloads[:0] = [EMPTY_ENTRY] * (first_seq - group_start)
            first_seq = group_start
        return first_seq, _neutralized(payloads), size, False

    # -- ending ----------------------------------------------------------------------

    def end(self) -> None:
        """The apply returns once it reaches this point (a scheduled run is done)."""
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)

    def again(self) -> None:
        """Put the end marker back: ``gather`` took it while planning ahead."""
        self.queue.put_nowait(None)

    def drop(self) -> None:
        """Drop everything queued and end the apply: the next Hello resumes from the level."""
        self._carry = None
        self._group_start = None
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


# An ``aborted`` mark has no ops: its fields and positions fit in this many bytes.
_MARK_BYTES = 96


def _group_cut(payloads: Sequence[bytes]) -> int:
    """How many leading entries end at a group end (0: the first group is not complete)."""
    for i in range(len(payloads) - 1, -1, -1):
        if not mark(payloads[i]).continued:
            return i + 1
    return 0


def _neutralized(payloads: list[bytes]) -> list[bytes]:
    """The batch with every fragment of an aborted group made an empty entry (rule S2).

    The batch holds whole groups, so an aborted mark's group is the run of
    ``continued`` entries just before it.
    """
    for i, p in enumerate(payloads):
        if len(p) <= _MARK_BYTES and p and mark(p).aborted:
            j = i
            while True:
                payloads[j] = EMPTY_ENTRY
                if j == 0 or not mark(payloads[j - 1]).continued:
                    break
                j -= 1
    return payloads


def _first_group_aborted(payloads: Sequence[bytes]) -> bool:
    """Whether the batch's first group ends with an ``aborted`` mark."""
    for p in payloads:
        m = mark(p)
        if not m.continued:
            return m.aborted
    return False
