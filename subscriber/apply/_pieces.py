"""A group larger than the batch limits, applied in pieces in one target transaction.

(Issue 21; the format and the rules are in ``common/fragments.py``, the target
side in ``subscriber/targets/held.py``.)  The batcher hands such a group over in
pieces of at most ``[batch]`` limits, each but the last marked *open*.  Each
piece is planned on its own (walk, net effect, against the schemas the pieces
before it left) and written with the writer's ``write_held``: the first begins
the target transaction and checks the level, the next ones continue it, the
last one writes the level and commits.  Memory: one piece at a time.

Not retried and not narrowed: a failure rolls the whole group back
(:meth:`Pieces.abandon`) and is raised; the subscription then resumes (or
stops) before the group, whose first fragment is still ``level + 1``.  A piece
that does not continue the held group (the session was cut and the group is
sent again from its start, or the group was aborted and arrives as empty
entries from its start) abandons the held one first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._sequences import hand_positions
from subscriber.apply.entry import AnyEntry
from subscriber.apply.errors import ApplyError
from subscriber.apply.writer import Step, SubscriptionState, Writer

__all__ = ["Pieces"]


class Pieces:
    """The held-group side of :class:`~subscriber.apply.Applier` (a base class)."""

    subscription: str
    _writer: Writer
    _state: SubscriptionState | None
    _held_last: int | None = None  # the last seq written into the held transaction

    if TYPE_CHECKING:  # the Applier's

        @property
        def state(self) -> SubscriptionState: ...

        def _plan(
            self, first_seq: int, entries: Sequence[AnyEntry], schemas: dict[str, pb.TableSchema]
        ) -> tuple[list[Step], int]: ...

    @property
    def holding(self) -> bool:
        """A group's transaction is open on the target."""
        return self._held_last is not None

    def _piece_due(self, first_seq: int, hold: bool) -> bool:
        """Whether this batch is a piece of a held group (abandoning a stale one)."""
        if self._held_last is not None and first_seq != self._held_last + 1:
            self.abandon()
        return hold or self._held_last is not None

    def _apply_piece(
        self, first_seq: int, entries: Sequence[AnyEntry], incarnation: str, *, commit: bool
    ) -> tuple[int, int, int, int, float]:
        """(level, row changes, target rows written, entries, seconds) of one piece."""
        started = time.perf_counter()
        write: Any = getattr(self._writer, "write_held", None)
        if write is None:
            raise ApplyError(
                f"target {self._writer.dialect!r} cannot apply a transaction larger than the "
                "[batch] limits: raise max_entries and max_bytes",
                subscription=self.subscription,
                seq=first_seq,
            )
        state = self.state
        schemas = dict(state.schemas)
        last_seq = first_seq + len(entries) - 1
        try:
            steps, rows = self._plan(first_seq, entries, schemas)
            hand_positions(self._writer, entries)  # sequence positions (_sequences.py)
            written: int = write(
                self.subscription, incarnation, first_seq, last_seq, steps, commit=commit
            )
        except BaseException:
            self.abandon()
            raise
        level = last_seq if commit else state.level
        self._held_last = None if commit else last_seq
        self._state = SubscriptionState(level, incarnation, schemas)
        return level, rows, written, len(entries), time.perf_counter() - started

    def abandon(self) -> None:
        """Roll back a held group (nothing of it stays); the state is read again."""
        if self._held_last is None:
            return
        self._held_last = None
        self._state = None
        abandon = getattr(self._writer, "abandon", None)
        if abandon is not None:
            abandon()
