"""Groups of entries: a source transaction larger than one entry (issue 21).

Format
======
An ``Entry`` has three group fields (``proto/txrepl/v1/txrepl.proto``):
``continued`` (more fragments of this group follow, in the very next seq),
``fragment`` (the index within the group, 0 first) and ``aborted``.  A *group* is
a maximal run of consecutive seqs ``a..b`` where ``a..b-1`` have ``continued``
and ``b`` does not; an entry without fragments is a group of one.  A group holds
whole source transactions (one, or on SQLite several: see below), so it is the
unit that is never split on the target.

Publisher (``publisher/capture/``, ``publisher/publication.py``)
----------------------------------------------------------------
P1. Capture builds entries of at most ``max_entry_bytes`` (``[publisher]``); a
    group of transactions larger than that is appended as consecutive fragments
    as its changes accumulate, so capture holds one fragment at a time, not the
    transaction.  While a group is open no other append (``Publish``) enters the
    log: :meth:`Publication.append` makes it wait for the group's last fragment.
P2. Every fragment but the last carries, as ``source_position``, the capture
    position *before* the group (its resume point); the last carries the
    position after it.  The log's last entry therefore always names a resume
    point at a group boundary, and the SQLite capture's release (rows below every
    publication's position) never deletes the rows of an unfinished group.
P3. A group can be left open in the log: kill -9 of the publisher between two
    fragments, or capture failing in the middle of one (a row over the limit, the
    source gone).  The publication then appends one entry with ``aborted`` set
    and no ops (``fragment`` = the next index, ``source_position`` = the resume
    point) before anything else: at open (the log's last entry has ``continued``)
    and on the capture's error path.  Capture resumes from the resume point and
    carries the same transactions again, in a new group.

Subscriber (``subscriber/batcher.py``, ``subscriber/apply/engine.py``)
----------------------------------------------------------------------
S1. The level only ever moves to a group's last seq.  The batcher ends a batch
    only at a group end (:func:`group_ends`), unless the group alone is over the
    batch limits: then it hands the group out in pieces within the limits, which
    the apply writes into ONE target transaction held open until the group's
    last fragment, committed with the level (``subscriber/apply/_pieces.py``,
    ``subscriber/targets/held.py``).  Narrowing a failed batch bisects only at
    group ends.  So the level never points inside a group, and a resume
    (level + 1) is always at a group's first fragment.
S2. An aborted group contributes nothing: its entries are applied as empty
    entries (:func:`neutralize`), so the level moves past them in the same
    target transaction as the group or groups around them.
S3. A batch, or all the pieces of one group, is one target transaction (rows and
    level together), so a group is on the target whole or not at all, whatever
    is killed when.

Feeds, cuts, retention: a feed may be cut anywhere, inside a group too; the
subscriber drops what it did not commit and resumes from its level, a group
start (S1).  Retention purges below the lowest valid level, so never the start
of a group a valid subscriber still needs.

kill -9, at every point
-----------------------
* Publisher, before a group's first fragment is durable: nothing of it is in the
  log; the source still holds it (PostgreSQL: the slot's confirmed position is
  before it; SQLite: its capture rows are not released).
* Publisher, after some fragments: P3 at the next open; subscribers that saw the
  fragments committed nothing of them (S1) and skip them (S2).
* Publisher, after the last fragment and before the source is told: capture
  resumes after the group's position (P2), nothing doubled.
* Subscriber, between fragments, between pieces (its target transaction held
  open) or during the apply: the target transaction holding the group and the
  level did not commit; the database rolls it back; resume at the group's start.

SQLite: its triggers carry no transaction id, so the capture cannot tell where
one transaction ends inside a poll; the unit it keeps whole is the poll (every
row committed when the poll began).  A poll over a long backlog is therefore one
group, applied as one target transaction.  Rejected: a transaction counter kept
by the triggers (one more write per application statement, against issue 21's
goal of a light touch on the source).
"""

from __future__ import annotations

from collections.abc import Sequence

from common.rpc import txrepl_pb2 as pb

__all__ = ["EMPTY_ENTRY", "group_ends", "mark", "neutralize"]

EMPTY_ENTRY = b""  # a serialized Entry with no ops


def mark(payload: bytes) -> pb.EntryMark:
    """The group fields of a serialized entry (its ops are skipped, not decoded)."""
    return pb.EntryMark.FromString(payload)


def group_ends(marks: Sequence[pb.EntryMark]) -> list[int]:
    """Indices ``i`` such that a batch may end after entry ``i`` (a group's last)."""
    return [i for i, m in enumerate(marks) if not m.continued]


def neutralize(payloads: Sequence[bytes], marks: Sequence[pb.EntryMark]) -> list[bytes]:
    """``payloads`` with every fragment of an aborted group replaced by an empty entry.

    Only groups that end within ``payloads`` are recognised: the caller passes
    whole groups (S1).
    """
    out = list(payloads)
    start = 0
    for i, m in enumerate(marks):
        if m.continued:
            continue
        if m.aborted:
            for j in range(start, i + 1):
                out[j] = EMPTY_ENTRY
        start = i + 1
    return out
