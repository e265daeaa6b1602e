"""Between the stream and the apply: a bounded queue that coalesces batches.

Two threads (issue 23): the event loop's receive loop puts (:meth:`Batcher.put`,
a coroutine), the session's apply thread takes (:meth:`Batcher.take`, blocking),
so the loop is not woken to hand each batch over.  One lock covers every field
both sides touch; a take that finds nothing marks itself idle and waits for the
bell (a ``SimpleQueue``), which the next put, end or drop rings once, after
releasing the lock (so the woken thread does not wait for it again); a put that
finds the queue full waits on a future of the loop's that a take resolves through
``call_soon_threadsafe`` (only then: the loop hears of takes only when it waits
for room).  Both waits are registered under the lock before it is released, so
neither side misses the other's signal, and the bell is rung only for a marked
wait, so it never holds a stale ring.  One taker at a time (the apply thread, or
the plan made ahead while the apply thread does not take).

Back-pressure: received batches wait in a bounded queue (``queue_batches`` items,
plus the one a full queue's put waits with, as before); the receive loop blocks on
a full queue and stops reading the stream, so a slow apply shows at the publisher
as a slow feed, never as memory growth here.

Coalescing: a batch that arrives while the previous one has not been taken by
the apply yet (queued) joins it (consecutive seqs), up to 1/``queue_batches`` of
the batch limits (``max_entries``, ``max_bytes``); only a full queue blocks the
reading.  In sync the publisher sends entries one by one as they commit, so
without this an apply would get at most ``queue_batches`` entries and fall behind
a busy source however large ``max_entries`` is.  ``taken`` is set under the lock,
so a put never extends an item the apply already holds.

Memory: stays bounded by the same limits: the queue holds at most
``queue_batches`` + 1 items of at most ``max_entries / queue_batches`` entries
and ``max_bytes / queue_batches`` bytes each (a larger incoming batch is queued in
pieces): about ``max_bytes`` in all.

The apply takes work with :meth:`Batcher.take`: everything that arrived while
the last apply ran, up to ``max_entries`` / ``max_bytes``.  The end mark (``None``
in the queue: :meth:`end`, :meth:`drop`) stays where it is once reached, so every
later take returns ``None`` too (a plan made ahead that met it, then the apply).

Natural batching (issue 23): ``take`` never waits for more than what is
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
follows the last group end of a taken batch is carried over to the next
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
import queue
import threading
import time
from collections import deque
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

Taken = tuple[int, list[bytes], int, bool]


@dataclass
class Received:
    """Consecutive entries received, waiting to be applied."""

    first_seq: int
    entries: list[bytes]
    head: int
    received_at: float = field(default_factory=time.monotonic)
    size: int = 0  # bytes of the entries
    taken: bool = False  # by the apply: nothing may join it any more


class Batcher:
    """One session's queue from the receive loop (the event loop) to the apply thread."""

    def __init__(
        self, batch: BatchConfig, state: SubscriptionState, interrupted: asyncio.Event
    ) -> None:
        self.batch = batch
        self.state = state
        self._interrupted = interrupted
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()  # rung for an idle take
        self._idle = False  # a take waits for the bell
        # Received items and the end mark (None); one more than queue_batches: the item
        # a full queue's put used to wait with (the module docstring).
        self._items: deque[Received | None] = deque()
        self._capacity = batch.queue_batches + 1
        self._room: asyncio.Future[None] | None = None  # a put waiting for room
        self.room_entries = max(1, batch.max_entries // batch.queue_batches)
        self.room_bytes = max(1, batch.max_bytes // batch.queue_batches)
        self._last: Received | None = None  # the newest item queued
        self._carry: Received | None = None  # entries after the last group end of a batch
        self._group_start: int | None = None  # of a group handed out in pieces, still open
        self.received_at = time.monotonic()  # of the oldest part of the last taken batch

    # -- the receive side (the event loop) ---------------------------------------------

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
            while (wait := self._queue(first_seq + i, chunk, head, size)) is not None:
                if not await self._room_made(wait, consumer):
                    return False
        return True

    def _queue(
        self, first_seq: int, chunk: list[bytes], head: int, size: int
    ) -> asyncio.Future[None] | None:
        """Queue ``chunk`` (None), or the future a take resolves once there is room."""
        with self._lock:
            room = self._queued(first_seq, chunk, head, size)
            ring, self._idle = self._idle, False
        if ring:
            self._bell.put(None)  # wakes the apply thread: it waited for this
        return room

    def _queued(
        self, first_seq: int, chunk: list[bytes], head: int, size: int
    ) -> asyncio.Future[None] | None:
        """:meth:`_queue` under the lock."""
        last = self._last
        if (
            last is not None
            and not last.taken
            and len(last.entries) + len(chunk) <= self.room_entries
            and last.size + size <= self.room_bytes
        ):
            # Not taken by the apply yet (under the lock): ride along.
            last.entries.extend(chunk)
            last.head = head
            last.size += size
            return None
        items = self._items
        if len(items) < self._capacity:
            self._last = Received(first_seq, chunk, head, size=size)
            items.append(self._last)
            return None
        room = self._room = self._loop.create_future()
        return room

    async def _room_made(self, room: asyncio.Future[None], consumer: asyncio.Task[None]) -> bool:
        """Wait until a take made room; False if the apply ended first."""
        intr = asyncio.ensure_future(self._interrupted.wait())
        waits: set[asyncio.Future[Any]] = {room, consumer, intr}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            intr.cancel()
        if room in done:
            return True
        with self._lock:
            if self._room is room:
                self._room = None
        if self._interrupted.is_set():
            raise Interrupted()
        return False

    def close(self) -> None:
        """The receive loop is ending: what was not queued is resent after the next Hello."""
        with self._lock:
            room, self._room = self._room, None
        if room is not None:
            room.cancel()

    # -- the apply side (the apply thread) ---------------------------------------------

    def pending(self) -> bool:
        with self._lock:
            return self._carry is not None or bool(self._items)

    def take(self) -> Taken | None:
        """The next batch to apply, or None once the session ends; blocks while empty.

        Returns (first seq, entries, bytes, open): ``open`` when the batch is a piece
        of a group over the limits that the next batch goes on with.

        Natural batching: waits only while nothing at all is queued; then takes
        everything that arrived while the last apply ran, up to the limits, and
        returns at once (no timer).  :attr:`received_at` is then the arrival
        time (``time.monotonic``) of the batch's oldest part.
        """
        with self._lock:
            try:
                return self._take()
            finally:
                self._made_room()

    def _take(self) -> Taken | None:
        items, max_entries, max_bytes = self._items, self.batch.max_entries, self.batch.max_bytes
        item: Received | None
        if self._carry is not None:
            item, self._carry = self._carry, None
        else:
            item = self._next()
        if item is None:
            return None
        item.taken = True
        self.received_at = item.received_at
        first_seq = item.first_seq
        payloads = list(item.entries)
        size = item.size
        while len(payloads) < max_entries and size < max_bytes and items and items[0] is not None:
            nxt = items.popleft()
            assert nxt is not None
            nxt.taken = True
            payloads.extend(nxt.entries)
            size += nxt.size
        cut = _group_cut(payloads)
        while cut == 0 and len(payloads) < max_entries and size < max_bytes:
            if size >= PIECE_BYTES and not items:
                break  # a group still arriving: apply what is here while the rest comes
            # The first group is not all here yet: wait for more, up to the limits.
            self._made_room()
            more = self._next()
            if more is None:
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

    def _next(self) -> Received | None:
        """The oldest item, waiting for one (the lock held); the end mark stays."""
        items, lock = self._items, self._lock
        while not items:
            self._idle = True
            lock.release()
            try:
                self._bell.get()
            finally:
                lock.acquire()
        if items[0] is None:
            return None
        return items.popleft()

    def _made_room(self) -> None:
        """Wake a put waiting for room, if any (the lock held)."""
        room = self._room
        if room is not None and len(self._items) < self._capacity:
            self._room = None
            try:
                self._loop.call_soon_threadsafe(_resolve, room)
            except RuntimeError:  # the loop closed: nobody waits
                pass

    # -- ending ----------------------------------------------------------------------

    def end(self) -> None:
        """The apply returns once it reaches this point (a scheduled run is done)."""
        with self._lock:
            self._items.append(None)
            ring, self._idle = self._idle, False
        if ring:
            self._bell.put(None)

    def drop(self) -> None:
        """Drop everything queued and end the apply: the next Hello resumes from the level."""
        with self._lock:
            self._carry = None
            self._group_start = None
            self._items.clear()
            self._items.append(None)
            self._last = None
            self._made_room()
            ring, self._idle = self._idle, False
        if ring:
            self._bell.put(None)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


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
