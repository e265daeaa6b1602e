"""Reads of the entries appended last (served from memory) and waits for the head
(one watch per event loop): issue 23, the publisher's CPU per in-sync entry."""

from __future__ import annotations

import asyncio
import mmap
import random
from pathlib import Path
from typing import Any

import pytest

from publisher.log import Log, PurgedError, open_log
from publisher.log._recent import Recent
from publisher.log._watch import HeadWatch

SEG = 4096


def payload(seq: int, size: int = 100) -> bytes:
    return (f"{seq}:".encode() * size)[:size]


@pytest.fixture
def log(tmp_path: Path):
    lg = open_log(tmp_path / "pub", segment_bytes=SEG)
    yield lg
    lg.close()


class _CountingMmap(mmap.mmap):
    made = 0

    def __new__(cls, *args: Any, **kwargs: Any) -> _CountingMmap:
        cls.made += 1
        return super().__new__(cls, *args, **kwargs)


def test_reading_each_entry_as_it_is_appended_maps_no_file(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An in-sync reader's read of the entry just appended costs no new mapping of the
    active segment (before: one per read, as the file had grown)."""
    monkeypatch.setattr(mmap, "mmap", _CountingMmap)
    _CountingMmap.made = 0
    for s in range(1, 201):
        assert log.append([payload(s)]) == s
        assert log.read(s) == [payload(s)]
    assert _CountingMmap.made == 0


def test_reads_from_memory_and_from_the_file_return_the_same(tmp_path: Path) -> None:
    """Every read, wherever it starts and whatever its limits, returns what the same
    read returns from the segment files after a reopen (nothing kept in memory)."""
    rng = random.Random(23)
    directory = tmp_path / "pub"
    sizes: dict[int, int] = {}
    lg = open_log(directory, segment_bytes=SEG)
    for _ in range(120):  # appends of 1-4 entries, some larger than the memory kept
        n = rng.randint(1, 4)
        first = lg.head + 1
        batch = []
        for s in range(first, first + n):
            sizes[s] = rng.choice((10, 100, 700, 3000))
            batch.append(payload(s, sizes[s]))
        assert lg.append(batch) == first
    lg._recent.max_bytes = 4000  # keep a short memory: reads straddle it
    lg.append([payload(lg.head + 1, 50)])
    sizes[lg.head] = 50
    head = lg.head
    cases = [
        (f, rng.randint(1, 8), rng.choice((1, 200, 5000, 1 << 20))) for f in range(1, head + 2)
    ]
    from_memory = [lg.read(f, max_entries=m, max_bytes=b) for f, m, b in cases]
    lg.close()
    lg = open_log(directory, segment_bytes=SEG)
    try:
        assert len(lg._recent) == 0
        from_file = [lg.read(f, max_entries=m, max_bytes=b) for f, m, b in cases]
    finally:
        lg.close()
    assert from_memory == from_file
    for (f, _, _), got in zip(cases, from_memory, strict=True):
        assert got == [payload(s, sizes[s]) for s in range(f, f + len(got))]


def test_memory_holds_only_the_last_entries_within_its_bounds() -> None:
    """The memory keeps the last appends, contiguous, within its bytes and entries
    bounds; an entry larger than the budget is not kept; reads outside it say so."""
    r = Recent(1, max_bytes=1000, max_entries=5)
    r.add(1, [b"a" * 100, b"b" * 100])
    assert (r.first, len(r)) == (1, 2)
    r.add(3, [b"c" * 100] * 5)  # seqs 3..7: only the last five entries stay
    assert (r.first, len(r)) == (3, 5)
    assert r.read(2, 7, 10, 1 << 20) is None
    assert r.read(8, 7, 10, 1 << 20) is None
    assert r.read(6, 5, 10, 1 << 20) is None  # beyond the head: never
    assert r.read(3, 7, 10, 250) == [b"c" * 100] * 2
    assert r.read(3, 6, 10, 1 << 20) == [b"c" * 100] * 4
    r.add(8, [b"x" * 2000])  # larger than the budget: nothing kept
    assert (r.first, len(r)) == (9, 0)
    r.add(9, [b"y"])
    assert r.read(9, 9, 1, 1) == [b"y"]
    r.add(20, [b"z"])  # not contiguous (a reopened log's first append): start afresh
    assert (r.first, len(r)) == (20, 1)


def test_many_small_appends_keep_the_memory_bounded() -> None:
    """Dropping the oldest entries one by one keeps the memory's list compact."""
    r = Recent(1, max_bytes=1 << 20, max_entries=100)
    for s in range(1, 20_001):
        r.add(s, [b"%d" % s])
    assert (r.first, len(r)) == (19_901, 100)
    assert len(r._entries) < 2_000
    assert r.read(19_950, 20_000, 3, 1 << 20) == [b"19950", b"19951", b"19952"]


def test_entries_dropped_from_memory_are_released_at_once() -> None:
    """Large entries dropped as newer ones come are freed then, not when the list is
    next compacted: the memory never holds more payload bytes than its bound (a 40 MB
    backlog of 1 MiB entries once held 30 MiB more than that)."""
    r = Recent(1, max_bytes=1 << 20)
    for s in range(1, 201):
        r.add(s, [bytes(300_000)])
    assert sum(map(len, r._entries)) <= r.max_bytes
    assert len(r) == 3


def test_a_purged_seq_is_refused_even_when_still_in_memory(tmp_path: Path) -> None:
    """Retention decides what is readable: a read below the first retained seq raises
    PurgedError though the memory may still hold it."""
    lg = open_log(tmp_path / "pub", segment_bytes=SEG)
    try:
        for s in range(1, 121):
            lg.append([payload(s)])
        first_of_last = lg._segments[-1].first_seq
        assert lg.purge(first_of_last - 1) > 0
        assert lg._recent.first < lg.first_seq
        with pytest.raises(PurgedError):
            lg.read(lg.first_seq - 1)
        assert lg.read(lg.first_seq)[0] == payload(lg.first_seq)
    finally:
        lg.close()


async def test_concurrent_waits_share_one_listener(log: Log) -> None:
    """Twenty waits for the head on one event loop add one log listener between them
    (before: a listener, a future and a task per wait), and each wakes at its seq."""
    waits = [asyncio.ensure_future(log.wait_for(s, timeout=30)) for s in range(1, 21)]
    await asyncio.sleep(0)
    assert len(log._listeners) == 1
    await asyncio.to_thread(lambda: [log.append([payload(s)]) for s in range(1, 21)])
    results = await asyncio.gather(*waits)
    assert all(r >= s for r, s in zip(results, range(1, 21), strict=True))
    assert log.watch().waiting == 0
    assert len(log._listeners) == 1


async def test_no_wait_is_lost_when_the_head_moves_while_it_begins(log: Log) -> None:
    """A wait that begins while another thread makes its seq durable ends, each of
    500 times, though nothing is appended after that seq (a lost wake-up would wait
    for the next append, and there is none)."""
    loop = asyncio.get_running_loop()
    for seq in range(1, 501):
        append = loop.run_in_executor(None, log.append, [b"e"])  # starts at once
        got = await asyncio.wait_for(log.wait_for(seq), 30)
        assert got >= seq
        assert await append == seq
    assert log.watch().waiting == 0


async def test_a_head_published_while_a_wait_begins_is_not_missed() -> None:
    """The ordering argument of publisher/log/_watch.py, made to happen: the appending
    thread publishes the head and calls the listener after the waiter's first read of
    the head and before the waiter is registered; the wait still ends."""
    head = 0
    reads = 0

    def read_head() -> int:
        nonlocal head, reads
        reads += 1
        if reads == 1:  # the waiter's first read; then the appender runs
            head = 1
            watch.on_head(1)
            return 0
        return head

    watch = HeadWatch(read_head, asyncio.get_running_loop())
    fut = watch.future(1)
    assert await asyncio.wait_for(fut, 30) == 1
    watch.discard(fut)
    assert watch.waiting == 0


async def test_a_wait_cancelled_leaves_no_waiter(log: Log) -> None:
    """A wait cancelled by its caller leaves nothing behind in the watch."""
    wait = asyncio.ensure_future(log.wait_for(5))
    await asyncio.sleep(0)
    assert log.watch().waiting == 1
    wait.cancel()
    with pytest.raises(asyncio.CancelledError):
        await wait
    assert log.watch().waiting == 0
