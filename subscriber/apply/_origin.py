"""Origins at the apply: skip the target's own changes, one origin per transaction.

``common/origin.py`` has the rules; this is R3.  When the target is a node (its
``txrepl_node`` names it; the writer's ``node``), every entry of a batch is
looked at for its ``origin`` (a parse of the entry's tag stream that skips the
ops, as the batcher's group marks):

* an entry whose origin is the target's node came back from a node that applied
  it: it becomes an entry without ops (same commit time and group fields), so
  the level moves past it and nothing is written;
* the remaining entries are cut into runs of one origin (an entry without ops
  joins the run before it); each run is applied as its own target transaction
  with the writer's ``apply_origin`` set to the run's origin, so the target's
  own capture gives the rows it writes their true origin.  A run never splits a
  group: a group's entries come from one source transaction, or from one SQLite
  poll, which stops where the origin changes.

A target that is no node (a one-way replica) costs nothing here: no parse.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.fragments import mark
from common.rpc import txrepl_pb2 as pb
from subscriber.apply.entry import AnyEntry, RawEntry

__all__ = ["by_origin"]

Run = tuple[int, int, str]  # (start index, end index (exclusive), origin)


def _origin(entry: AnyEntry) -> str:
    return mark(entry.payload).origin if isinstance(entry, RawEntry) else entry.origin


def _without_ops(entry: AnyEntry) -> pb.Entry:
    full = entry.entry if isinstance(entry, RawEntry) else entry
    out = pb.Entry()
    out.CopyFrom(full)
    del out.ops[:]
    return out


def by_origin(entries: Sequence[AnyEntry], node: str) -> tuple[list[AnyEntry], list[Run]]:
    """The entries with ``node``'s own made empty, and their runs of one origin.

    An entry without an origin (an empty one, or one of an older build) joins the
    run before it (the first run, if it leads).
    """
    out: list[AnyEntry] = []
    runs: list[tuple[int, int, str | None]] = []
    for i, entry in enumerate(entries):
        origin: str | None = _origin(entry)
        if origin == node:
            out.append(_without_ops(entry))
            origin = None
        else:
            out.append(entry)
            origin = origin or None
        if runs and (origin is None or runs[-1][2] in (None, origin)):
            runs[-1] = (runs[-1][0], i + 1, origin or runs[-1][2])
        else:
            runs.append((i, i + 1, origin))
    return out, [(a, b, o or "") for a, b, o in runs]
