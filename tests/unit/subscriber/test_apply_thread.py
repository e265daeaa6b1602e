"""A session's apply thread (subscriber/_applythread.py): order, errors, its end."""

from __future__ import annotations

import asyncio
import threading

import pytest

from subscriber._applythread import ApplyThread


async def test_jobs_run_in_order_on_one_thread_and_errors_reach_the_caller() -> None:
    """Three jobs submitted at once run one after the other on the same thread (not
    the event loop's); a job's exception is raised where its result is awaited."""
    worker = ApplyThread("apply t")
    ran: list[tuple[int, int]] = []

    def job(n: int) -> int:
        ran.append((n, threading.get_ident()))
        return n * 10

    def fails() -> None:
        raise ValueError("the target refused")

    try:
        futures = [worker.submit(job, n) for n in range(3)]
        failing = worker.submit(fails)
        assert await asyncio.gather(*futures) == [0, 10, 20]
        with pytest.raises(ValueError, match="the target refused"):
            await failing
    finally:
        worker.close()
    assert [n for n, _ in ran] == [0, 1, 2]
    threads = {t for _, t in ran}
    assert len(threads) == 1
    assert threading.get_ident() not in threads


async def test_close_lets_the_job_in_hand_finish_and_ends_the_thread() -> None:
    """A job started before close() runs to its end (a target transaction cannot be
    stopped half way); then the thread ends, and no job is accepted any more."""
    worker = ApplyThread("apply t")
    started, go = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow() -> None:
        started.set()
        go.wait(30)
        finished.append(True)

    fut = worker.submit(slow)
    await asyncio.to_thread(started.wait, 30)
    worker.close()
    fut.cancel()  # the awaiting task gave up: the result is dropped, the job goes on
    go.set()
    await asyncio.to_thread(worker._thread.join, 30)
    assert finished == [True]
    assert not worker._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit(slow)
