"""Entries as the apply takes them: parsed messages, or the bytes a feed delivered.

The apply reads a batch's row changes from the serialized entries (``_walk.py``
walks bytes with numpy).  An entry received from a feed is already bytes: parsing
it into a ``txrepl.v1.Entry`` only for the walk to serialize it again cost about
8 us per W1 entry (0.26 s of a 32,000-entry batch).  :class:`RawEntry` keeps the
bytes and parses them only when a field is read (the batch's last commit time,
the Python walk, an entry stored as poisoned).

A payload that is not an ``Entry`` is refused where it is first read: the numpy
walk does not recognise it and the Python walk's parse raises protobuf's
``DecodeError``, as the parse on receipt did before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from common.fragments import mark
from common.rpc import txrepl_pb2 as pb

if TYPE_CHECKING:
    from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

__all__ = ["AnyEntry", "RawEntry", "group_half"]


class RawEntry:
    """A serialized ``txrepl.v1.Entry``, parsed on first use of a field."""

    __slots__ = ("_parsed", "payload")

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self._parsed: pb.Entry | None = None

    @property
    def entry(self) -> pb.Entry:
        """The parsed message (parsed once)."""
        if self._parsed is None:
            self._parsed = pb.Entry.FromString(self.payload)
        return self._parsed

    @property
    def commit_time_us(self) -> int:
        return self.entry.commit_time_us

    @property
    def source_position(self) -> str:
        return self.entry.source_position

    @property
    def ops(self) -> RepeatedCompositeFieldContainer[pb.Op]:
        return self.entry.ops

    def SerializeToString(self) -> bytes:  # protobuf's name: read like a message
        """The bytes as received (no re-serialization)."""
        return self.payload

    def __repr__(self) -> str:
        return f"RawEntry({len(self.payload)} bytes)"


AnyEntry: TypeAlias = pb.Entry | RawEntry
"""What :meth:`Applier.apply` and :meth:`Applier.plan` take, entry by entry."""


def _continued(entry: AnyEntry) -> bool:
    if isinstance(entry, RawEntry):
        return mark(entry.payload).continued
    return entry.continued


def group_half(entries: Sequence[AnyEntry]) -> int:
    """Where to split a failed batch in two: the group end nearest its middle.

    0 when the batch is one group (common/fragments.py, S1: the level never
    points inside a group, so narrowing never splits one).
    """
    ends = [i + 1 for i, e in enumerate(entries[:-1]) if not _continued(e)]
    if not ends:
        return 0
    middle = len(entries) / 2
    return min(ends, key=lambda i: abs(i - middle))
