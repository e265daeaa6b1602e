"""Natural batching (issue 23): an idle apply takes an entry at once; a busy one batches."""

from __future__ import annotations

import asyncio

from common.rpc import txrepl_pb2 as pb
from subscriber.batcher import Batcher
from subscriber.config import BatchConfig
from subscriber.state import SubscriptionState


def _entry(n: int) -> bytes:
    return pb.Entry(source_position=str(n)).SerializeToString()


def _in_sync_batcher(batch: BatchConfig | None = None) -> Batcher:
    state = SubscriptionState("s", 0, "inc")
    state.set("in_sync")
    return Batcher(batch or BatchConfig(), state, asyncio.Event())


def test_an_idle_apply_takes_a_single_entry_without_waiting_for_more() -> None:
    """In sync, one entry queued while the apply thread waits: its take returns that
    entry alone (nothing more is ever put: a take that waited for more would hang).

    A configuration that still names ``max_delay_ms`` (here a minute) changes nothing:
    the apply no longer lingers for more entries.
    """

    async def main() -> tuple[int, list[bytes], int, bool] | None:
        batcher = _in_sync_batcher(BatchConfig(max_delay_ms=60_000))
        take = asyncio.ensure_future(asyncio.to_thread(batcher.take))
        never = asyncio.ensure_future(asyncio.Event().wait())  # a consumer that stays
        await asyncio.sleep(0.05)  # the take is (most likely) waiting by now
        assert await batcher.put(1, [_entry(1)], 1, never)  # type: ignore[arg-type]
        try:
            return await asyncio.wait_for(take, 60)  # a guard against a hang only
        finally:
            never.cancel()
            batcher.drop()

    got = asyncio.run(main())
    assert got is not None
    first_seq, payloads, _, hold = got
    assert (first_seq, len(payloads), hold) == (1, 1, False)


def test_entries_arriving_during_an_apply_go_together_into_the_next() -> None:
    """Entries 2-6 arrive one by one while entry 1 is applied: the next apply takes all five."""

    async def main() -> list[tuple[int, int]]:
        batcher = _in_sync_batcher()
        never = asyncio.ensure_future(asyncio.Event().wait())
        assert await batcher.put(1, [_entry(1)], 1, never)  # type: ignore[arg-type]
        first = batcher.take()  # the apply of entry 1 starts (something is queued: no wait)
        assert first is not None
        for seq in range(2, 7):  # ... and runs while these arrive
            assert await batcher.put(seq, [_entry(seq)], seq, never)  # type: ignore[arg-type]
        got = batcher.take()
        never.cancel()
        assert got is not None
        return [(first[0], len(first[1])), (got[0], len(got[1]))]

    assert asyncio.run(main()) == [(1, 1), (2, 5)]
