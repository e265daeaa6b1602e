"""Replicate through a real ``Pair`` in the phases the pair tests share: rows present
at install, a backlog applied in one batch, live small batches, then a reinit's
snapshot into an empty target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.harness import Pair, wait_until


def settle(pair: Pair, differences: Callable[[], list[str]], timeout: float = 120.0) -> None:
    """Wait until the subscription is in sync and ``differences()`` is empty (or the
    subscription fails, or the publisher exits); then assert: publisher running, in
    sync, no differences.  In sync is waited for too: the rows of a catch-up's last
    batch are visible a few milliseconds before the subscription says ``in_sync``."""

    def done() -> bool:
        assert pair.pub is not None
        if not pair.pub.running:
            return True
        state = pair.status().state
        return state == "error" or (state == "in_sync" and not differences())

    try:
        wait_until(done, timeout, "the target to equal the source", interval=0.5)
    except TimeoutError:
        pass
    assert pair.pub is not None
    assert pair.pub.running, pair.pub.tail()
    st = pair.status()
    assert (st.state, differences()) == ("in_sync", []), st.last_error


def backlog_live_reinit(
    pair: Pair,
    work: Callable[[int, int], None],
    differences: Callable[[str], list[str]],
    new_target: Callable[[], str],
    spark: Any,
    start: int,
) -> None:
    """``work(start, n)`` writes ``n`` source transactions from number ``start``: 40
    as a backlog before the subscriber starts, then 18 one by one (live); the target
    (``pair.target_url``) must equal the source after each phase, and so must a fresh
    target (``new_target()``) loaded from a reinit's snapshot."""
    try:
        pair.start_publisher()
        work(start, 40)
        pair.start_subscriber()
        settle(pair, lambda: differences(pair.target_url))
        for i in range(start + 40, start + 58):
            work(i, 1)
        settle(pair, lambda: differences(pair.target_url))
        fresh = new_target()
        pair.load_snapshot(fresh, spark=spark)
        assert differences(fresh) == []
    finally:
        pair.stop()
