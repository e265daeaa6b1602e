"""The batcher and groups of fragments: batches end at group ends, or are marked open pieces."""

from __future__ import annotations

import asyncio

from common.rpc import txrepl_pb2 as pb
from subscriber.batcher import Batcher
from subscriber.config import BatchConfig
from subscriber.state import SubscriptionState

Got = tuple[int, list[bytes], int, bool]


def _group(n: int, tag: str) -> list[bytes]:
    """A group of ``n`` fragments (one entry when n == 1), each carrying ``tag``."""
    return [
        pb.Entry(
            source_position=f"{tag}{i}", continued=i < n - 1, fragment=i if n > 1 else 0
        ).SerializeToString()
        for i in range(n)
    ]


def _aborted(after: int) -> bytes:
    return pb.Entry(aborted=True, fragment=after).SerializeToString()


def _run(entries: list[bytes], max_entries: int, batches: int) -> list[Got]:
    """Feed ``entries`` (seq 1, 2, ...) to a batcher and gather ``batches`` batches."""

    async def main() -> list[Got]:
        state = SubscriptionState("s", 0, "inc")
        batcher = Batcher(
            BatchConfig(max_entries=max_entries, queue_batches=1),
            state,
            asyncio.Event(),
        )
        got: list[Got] = []

        async def apply() -> None:
            for _ in range(batches):
                batch = await asyncio.to_thread(batcher.take)
                assert batch is not None
                got.append(batch)

        consumer = asyncio.ensure_future(apply())
        for i, e in enumerate(entries):
            assert await batcher.put(i + 1, [e], len(entries), consumer)
        await asyncio.wait_for(consumer, 5)
        return got

    return asyncio.run(main())


def _tags(payloads: list[bytes]) -> list[str]:
    return [pb.Entry.FromString(p).source_position for p in payloads]


def test_a_batch_never_ends_inside_a_group() -> None:
    """Limit 4: groups of 3 and 3 are not cut at 4; the rest waits for the next batch."""
    got = _run(_group(3, "a") + _group(3, "b") + _group(1, "c"), 4, 2)
    assert [(first, _tags(p), hold) for first, p, _, hold in got] == [
        (1, ["a0", "a1", "a2"], False),
        (4, ["b0", "b1", "b2", "c0"], False),
    ]


def test_a_group_over_the_limit_comes_in_open_pieces() -> None:
    """A group of 10 with a limit of 4: pieces 4 (open), 4 (open), then its end."""
    got = _run(_group(10, "g") + _group(1, "h"), 4, 3)
    assert [(first, len(p), hold) for first, p, _, hold in got] == [
        (1, 4, True),
        (5, 4, True),
        (9, 3, False),
    ]


def test_an_aborted_group_in_pieces_starts_again_empty_from_its_start() -> None:
    """Fragments 0-5 then an aborted mark: the closing batch is seqs 1-7, all empty."""
    entries = [*_group(7, "x")[:6], _aborted(6), *_group(1, "y")]
    got = _run(entries, 4, 2)
    assert got[0][3] is True
    first, payloads, _, hold = got[1]
    assert (first, hold) == (1, False)
    assert payloads[:7] == [b""] * 7
    assert _tags(payloads[7:]) == ["y0"]


def _arriving(fragment_bytes: int) -> list[Got]:
    """A group of 3 fragments of about ``fragment_bytes`` each, arriving one at a time
    while the apply is idle (as a backlog's group comes while the publisher builds it)."""

    async def main() -> list[Got]:
        batcher = Batcher(BatchConfig(), SubscriptionState("s", 0, "inc"), asyncio.Event())
        got: list[Got] = []

        async def apply() -> None:
            while not got or got[-1][3]:  # until a batch closes the group
                batch = await asyncio.to_thread(batcher.take)
                assert batch is not None
                got.append(batch)

        consumer = asyncio.ensure_future(apply())
        for i in range(3):
            e = pb.Entry(
                source_position=f"g{i}", continued=i < 2, fragment=i,
                ops=[pb.Op(sql=pb.SqlStatement(sql="x" * fragment_bytes))],
            ).SerializeToString()  # fmt: skip
            assert await batcher.put(i + 1, [e], 3, consumer)
            await asyncio.sleep(0.05)  # the next fragment is still being built
        await asyncio.wait_for(consumer, 5)
        return got

    return asyncio.run(main())


def test_a_large_group_still_arriving_is_applied_in_pieces_as_it_comes() -> None:
    """Fragments of 1.5 MiB: each is handed out (open) while the next is on its way,
    instead of the whole group after its last fragment."""
    got = _arriving(1536 * 1024)
    assert [(first, _tags(p), hold) for first, p, _, hold in got] == [
        (1, ["g0"], True),
        (2, ["g1"], True),
        (3, ["g2"], False),
    ]


def test_a_small_group_still_arriving_is_applied_whole() -> None:
    """Fragments of 100 KiB (below PIECE_BYTES): one batch once the group is complete."""
    got = _arriving(100 * 1024)
    assert [(first, _tags(p), hold) for first, p, _, hold in got] == [
        (1, ["g0", "g1", "g2"], False)
    ]
