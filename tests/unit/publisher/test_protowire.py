"""The captures' protobuf wire primitives (publisher/capture/protowire.py) write the
bytes protobuf itself writes: every varint length, its boundaries and random values
of each width, protobuf's own serializer as the oracle."""

from __future__ import annotations

import random

from common.rpc import txrepl_pb2 as pb
from publisher.capture.protowire import INT_TAG, length, zigzag


def _values() -> list[int]:
    rng = random.Random(5)
    out = [0, 1, -1, 2**63 - 1, -(2**63)]
    for bits in range(1, 64):
        out += [2**bits - 1, 2**bits, -(2**bits), -(2**bits) + 1]
        out += [rng.randrange(2 ** (bits - 1), 2**bits) * rng.choice((1, -1)) for _ in range(20)]
    return [v for v in out if -(2**63) <= v < 2**63]


def test_a_sint64_is_written_as_protobuf_writes_it() -> None:
    """zigzag (and the varint under it, every length from one byte to ten)."""
    for v in _values():
        assert INT_TAG + zigzag(v) == pb.Value(int=v).SerializeToString(), v


def test_a_length_delimited_field_is_written_as_protobuf_writes_it() -> None:
    for n in (0, 1, 127, 128, 300, 16_383, 16_384, 70_000):
        text = "x" * n
        assert length(b"\x2a", text.encode()) == pb.Value(text=text).SerializeToString(), n
