"""Group commit: concurrent appenders under fsync="always" share fsyncs, and every
appender returns only after its own entries are durable."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from publisher.log import open_log


def test_concurrent_appenders_share_fsyncs(tmp_path: Path):
    """Many threads appending get distinct consecutive seqs with far fewer fsyncs."""
    threads_n, per_thread = 32, 40
    with open_log(tmp_path / "pub", segment_bytes=64 * 1024) as lg:
        fsyncs = 0
        durable_at_fsync: list[int] = []

        def hook(fd: int) -> None:
            nonlocal fsyncs
            fsyncs += 1
            durable_at_fsync.append(lg._written)
            time.sleep(0.002)  # a slow disk, so that appenders pile up behind the leader

        lg.fsync_hook = hook
        results: dict[int, bytes] = {}
        lock = threading.Lock()
        barrier = threading.Barrier(threads_n)
        returned_before_durable: list[int] = []

        def worker(t: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                body = f"t{t}-{i}".encode()
                seq = lg.append([body])
                if lg.head < seq:
                    returned_before_durable.append(seq)
                with lock:
                    results[seq] = body

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        total = threads_n * per_thread
        assert sorted(results) == list(range(1, total + 1))
        assert not returned_before_durable
        assert lg.read(1, max_entries=total) == [results[s] for s in range(1, total + 1)]
        # One fsync per append would be `total`; group commit must do much better.
        assert fsyncs < total / 4, fsyncs
        assert lg.head == total


def test_batch_append_is_one_fsync(tmp_path: Path):
    """One append of many entries costs a single fsync."""
    with open_log(tmp_path / "pub") as lg:
        calls: list[int] = []
        lg.fsync_hook = calls.append
        lg.append([b"x"] * 1000)
        assert len(calls) == 1


def test_listener_heads_increase_under_concurrency(tmp_path: Path):
    """Listeners are called by one leader at a time, with strictly increasing heads."""
    with open_log(tmp_path / "pub", segment_bytes=8192) as lg:
        heads: list[int] = []
        lg.add_listener(heads.append)

        def worker() -> None:
            for _ in range(100):
                lg.append([b"y" * 50])

        ts = [threading.Thread(target=worker) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert heads == sorted(set(heads))
        assert heads[-1] == 800


def test_segment_rolls_under_concurrency_keep_records_in_their_segment(tmp_path: Path):
    """Concurrent appenders racing segment rolls (slow fsync) leave a log that reopens
    with every entry, each segment holding exactly its own records."""
    import random

    d = tmp_path / "pub"
    expected: dict[int, bytes] = {}
    lock = threading.Lock()
    with open_log(d, segment_bytes=64 * 1024) as lg:

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(100):
                batch = [rng.randbytes(rng.randint(0, 4096)) for _ in range(rng.randint(1, 32))]
                first = lg.append(batch)
                with lock:
                    expected.update((first + i, p) for i, p in enumerate(batch))
                time.sleep(0)  # let other appenders in between (widens the roll races)

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for seg in lg._segments[:-1]:
            assert seg.path.stat().st_size == seg.size
        active = lg._segments[-1]  # its records, then only preallocated zeros
        assert active.path.read_bytes()[active.size :].strip(b"\0") == b""
    with open_log(d) as lg:
        got = lg.read(1, max_entries=len(expected), max_bytes=1 << 30)
        assert got == [expected[s] for s in range(1, len(expected) + 1)]


def test_append_without_wait_is_visible_only_once_flushed(tmp_path: Path):
    """wait=False queues entries: readers and listeners see them after the next flush,
    which makes all of them durable with one fsync; a reopen after close keeps them."""
    with open_log(tmp_path / "pub") as lg:
        fsyncs: list[int] = []
        heads: list[int] = []
        lg.fsync_hook = fsyncs.append
        lg.add_listener(heads.append)
        seqs = [lg.append([f"e{i}".encode()], wait=False) for i in range(1, 6)]
        assert seqs == [1, 2, 3, 4, 5]
        assert lg.head == 0
        assert lg.read(1) == []
        assert heads == []
        assert fsyncs == []
        assert lg.flush() == 5
        assert len(fsyncs) == 1
        assert heads == [5]
        assert lg.read(1) == [f"e{i}".encode() for i in range(1, 6)]
        lg.append([b"e6"], wait=False)
    with open_log(tmp_path / "pub", create=False) as lg:
        assert lg.head == 6
        assert lg.read(6) == [b"e6"]
