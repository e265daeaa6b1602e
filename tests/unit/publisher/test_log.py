"""The public behaviour of publisher.log: append, read at every boundary, listeners,
wait_for, purge and retention limits, incarnation, reopen."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

import publisher.log as log_pkg
from publisher.log import (
    CorruptLogError,
    Log,
    LogClosedError,
    LogError,
    LogLockedError,
    PurgedError,
    open_log,
)

SEG = 4096  # small segments so that tests cross segment boundaries


def payload(seq: int, size: int = 100) -> bytes:
    """A deterministic payload for ``seq`` (distinct for every seq)."""
    return (f"{seq}:".encode() * size)[:size]


def fill(log: Log, n: int, size: int = 100) -> None:
    start = log.head + 1
    for s in range(start, start + n):
        assert log.append([payload(s, size)]) == s


@pytest.fixture
def log(tmp_path: Path):
    lg = open_log(tmp_path / "pub", segment_bytes=SEG)
    yield lg
    lg.close()


def test_public_names_are_exported():
    """The package exposes exactly its documented public face."""
    assert set(log_pkg.__all__) >= {"Log", "open_log", "LogError", "CorruptLogError", "PurgedError"}
    for name in log_pkg.__all__:
        assert hasattr(log_pkg, name)


def test_empty_log(log: Log):
    """A new log has head 0, first_seq 1, a UUID4 incarnation and reads nothing."""
    assert log.head == 0
    assert log.first_seq == 1
    assert uuid.UUID(log.incarnation).version == 4
    assert log.read(1) == []
    assert log.read(5) == []
    assert log.size_bytes > 0


def test_append_returns_first_of_consecutive_seqs(log: Log):
    """append() gives consecutive seqs and returns the first one."""
    assert log.append([b"a", b"b", b"c"]) == 1
    assert log.append([b"d"]) == 4
    assert log.head == 4
    assert log.read(1) == [b"a", b"b", b"c", b"d"]


def test_append_rejects_empty_batch(log: Log):
    """An empty append is a caller error, not a no-op that returns a bogus seq."""
    with pytest.raises(ValueError):
        log.append([])


def test_payloads_round_trip_byte_for_byte(log: Log):
    """Arbitrary bytes, including empty and ones that look like record magic, come back."""
    items = [b"", b"\x00" * 7, b"TXRE" * 10, bytes(range(256)) * 20, os.urandom(5000)]
    first = log.append(items)
    assert log.read(first, max_bytes=1 << 30) == items


def test_reads_at_every_segment_boundary(log: Log):
    """Reads starting at the first and last entry of every segment return the right run."""
    fill(log, 400)
    segs = log._segments  # white box: where the boundaries are
    assert len(segs) > 3
    for seg in segs:
        if seg.count == 0:
            continue
        for start in (seg.first_seq, seg.last_seq, seg.last_seq + 1):
            if start > log.head:
                assert log.read(start) == []
                continue
            got = log.read(start, max_entries=50, max_bytes=1 << 30)
            expected_n = min(50, log.head - start + 1)
            assert got == [payload(s) for s in range(start, start + expected_n)]


def test_read_every_start_seq(log: Log):
    """A read from any seq returns exactly that seq first (index interval and skipping)."""
    fill(log, 300, size=37)
    for s in range(1, 301):
        assert log.read(s, max_entries=1) == [payload(s, 37)]


def test_read_beyond_head_is_empty(log: Log):
    """from_seq > head returns [] rather than raising."""
    fill(log, 3)
    assert log.read(4) == []
    assert log.read(10**9) == []


def test_read_limits(log: Log):
    """max_entries and max_bytes bound a read, but at least one entry is returned."""
    fill(log, 50, size=100)
    assert len(log.read(1, max_entries=7)) == 7
    assert len(log.read(1, max_bytes=250)) == 2
    assert log.read(1, max_bytes=1) == [payload(1)]
    with pytest.raises(ValueError):
        log.read(1, max_entries=0)


def test_large_entry_bigger_than_segment(log: Log):
    """An entry larger than segment_bytes gets a segment of its own."""
    fill(log, 2)
    big = os.urandom(3 * SEG)
    seq = log.append([big])
    fill(log, 2)
    assert log.read(seq, max_bytes=1) == [big]
    assert log.read(seq - 1, max_entries=3, max_bytes=1 << 30)[1] == big


def test_reopen_keeps_entries_and_incarnation(tmp_path: Path):
    """Closing and reopening keeps every entry, the head and the incarnation."""
    d = tmp_path / "pub"
    with open_log(d, segment_bytes=SEG) as lg:
        fill(lg, 250)
        inc = lg.incarnation
    with open_log(d, segment_bytes=SEG, create=False) as lg:
        assert lg.incarnation == inc
        assert lg.head == 250
        assert lg.read(1, max_entries=1000, max_bytes=1 << 30) == [
            payload(s) for s in range(1, 251)
        ]
        assert lg.append([b"more"]) == 251
    with open_log(d, segment_bytes=SEG, verify="tail") as lg:
        assert lg.read(251) == [b"more"]


def test_create_false_on_missing_directory(tmp_path: Path):
    """create=False refuses to invent a log."""
    with pytest.raises(LogError):
        open_log(tmp_path / "nope", create=False)


def test_second_open_is_refused(tmp_path: Path):
    """Two Log objects on one directory would interleave appends: the second is refused."""
    with open_log(tmp_path / "pub"), pytest.raises(LogLockedError):
        open_log(tmp_path / "pub")


def test_closed_log_refuses_use(tmp_path: Path):
    """After close(), appends and reads raise LogClosedError; close() is idempotent."""
    lg = open_log(tmp_path / "pub")
    lg.append([b"x"])
    lg.close()
    lg.close()
    with pytest.raises(LogClosedError):
        lg.append([b"y"])
    with pytest.raises(LogClosedError):
        lg.read(1)


def test_listeners_get_each_new_head(log: Log):
    """A listener sees every durable head in increasing order until it unsubscribes."""
    seen: list[int] = []
    unsubscribe = log.add_listener(seen.append)
    log.append([b"a"])
    log.append([b"b", b"c"])
    unsubscribe()
    log.append([b"d"])
    assert seen == [1, 3]


def test_listener_sees_entry_readable(log: Log):
    """When a listener runs, the new entries are already readable."""
    got: list[list[bytes]] = []
    log.add_listener(lambda head: got.append(log.read(head)))
    log.append([b"a"])
    assert got == [[b"a"]]


def test_failing_listener_does_not_break_append(log: Log):
    """A listener that raises is logged; the append and other listeners are unaffected."""
    seen: list[int] = []

    def bad(head: int) -> None:
        raise RuntimeError("boom")

    log.add_listener(bad)
    log.add_listener(seen.append)
    assert log.append([b"a"]) == 1
    assert seen == [1]


async def test_wait_for_returns_when_head_reaches_seq(log: Log):
    """wait_for wakes (without polling) when another thread appends the awaited seq."""
    log.append([b"a"])
    assert await log.wait_for(1) == 1
    t = threading.Timer(0.05, lambda: log.append([b"b", b"c"]))
    t.start()
    try:
        assert await log.wait_for(2, timeout=5) == 3
    finally:
        t.join()


async def test_wait_for_timeout_returns_current_head(log: Log):
    """On timeout wait_for returns the current head and leaves no waiter behind."""
    log.append([b"a"])
    started = time.monotonic()
    assert await log.wait_for(5, timeout=0.05) == 1
    assert time.monotonic() - started < 2
    assert log.watch().waiting == 0


async def test_wait_for_many_waiters(log: Log):
    """Many concurrent waiters on different seqs each wake at their seq."""
    waiters = [asyncio.create_task(log.wait_for(s, timeout=5)) for s in range(1, 21)]
    await asyncio.sleep(0)

    def writer() -> None:
        for i in range(20):
            log.append([payload(i + 1)])

    await asyncio.to_thread(writer)
    results = await asyncio.gather(*waiters)
    assert all(r >= s for r, s in zip(results, range(1, 21), strict=True))


def test_purge_whole_segments_only(log: Log):
    """purge removes only segments entirely at or below up_to_seq, and counts entries."""
    fill(log, 300)
    segs = list(log._segments)
    boundary = segs[2].first_seq  # entries of segs[0..1] end at boundary - 1
    assert log.purge(boundary - 2) == segs[0].count
    assert log.first_seq == segs[1].first_seq
    assert log.purge(boundary - 1) == segs[1].count
    assert log.first_seq == boundary
    assert not segs[0].path.exists()
    with pytest.raises(PurgedError) as info:
        log.read(boundary - 1)
    assert info.value.seq == boundary - 1
    assert info.value.first_seq == boundary
    assert log.read(boundary)[0] == payload(boundary)


def test_purge_never_removes_head_segment(log: Log):
    """Purging everything keeps the segment that holds the head, so head stays readable."""
    fill(log, 300)
    log.purge(10**9)
    assert log.head == 300
    assert log.first_seq <= 300
    assert log.read(300) == [payload(300)]
    assert log.append([b"next"]) == 301


def test_purge_survives_reopen(tmp_path: Path):
    """After a purge and reopen, first_seq and head are what they were."""
    d = tmp_path / "pub"
    with open_log(d, segment_bytes=SEG) as lg:
        fill(lg, 300)
        lg.purge(150)
        first = lg.first_seq
    with open_log(d, segment_bytes=SEG) as lg:
        assert (lg.first_seq, lg.head) == (first, 300)


def test_enforce_size_limit(log: Log):
    """A size limit purges oldest segments until the total fits (keeping the head)."""
    fill(log, 400)
    before = log.size_bytes
    first = log.enforce_limits(max_bytes=before // 2, max_age_s=None)
    assert log.size_bytes <= before // 2 or len(log._segments) == 1
    assert first == log.first_seq > 1
    assert log.enforce_limits(None, None) == first


def test_enforce_age_limit(log: Log):
    """An age limit purges segments last written before the limit."""
    fill(log, 400)
    old = log._segments[0].path
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    first = log.enforce_limits(max_bytes=None, max_age_s=60)
    assert first == log._segments[0].first_seq
    assert not old.exists()
    assert log.read(log.head) == [payload(400)]


def test_interval_policy_makes_entries_visible_after_fsync(tmp_path: Path):
    """Under "interval", append returns before fsync; entries appear once flushed."""
    with open_log(tmp_path / "pub", fsync="interval", fsync_interval_ms=5) as lg:
        seen: list[int] = []
        lg.add_listener(seen.append)
        assert lg.append([b"a"]) == 1
        deadline = time.monotonic() + 5
        while lg.head < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert lg.read(1) == [b"a"]
        assert seen == [1]
        lg.append([b"b"])
        assert lg.flush() == 2


def test_incarnation_file_damage_refuses_open(tmp_path: Path):
    """A garbled INCARNATION file is corruption, not a reason to mint a new identity."""
    d = tmp_path / "pub"
    with open_log(d) as lg:
        lg.append([b"a"])
    (d / "INCARNATION").write_bytes(b"not-a-uuid\n")
    with pytest.raises(CorruptLogError) as info:
        open_log(d)
    assert info.value.path == d / "INCARNATION"


def test_missing_incarnation_with_entries_refuses_open(tmp_path: Path):
    """Entries without their incarnation cannot be served: refuse."""
    d = tmp_path / "pub"
    with open_log(d) as lg:
        lg.append([b"a"])
    (d / "INCARNATION").unlink()
    with pytest.raises(CorruptLogError):
        open_log(d)


def test_concurrent_readers_and_writer(log: Log):
    """Readers in other threads only ever see durable, correct, consecutive entries."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                head = log.head
                if head:
                    start = max(log.first_seq, head - 40)
                    got = log.read(start, max_entries=50, max_bytes=1 << 30)
                    assert got == [payload(s) for s in range(start, start + len(got))]
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        fill(log, 500)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
