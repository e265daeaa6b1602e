"""A target transaction held open between the pieces of one group (issue 21).

A group of fragments larger than the ``[batch]`` limits is applied in pieces, all
inside ONE target transaction: the first piece begins it and checks the level
(``first_seq - 1``), each later piece must continue at the held last seq + 1, and
only the last piece writes the level and commits.  So the target never shows
part of a group, and a crash anywhere (kill -9 of the subscriber, the connection
lost) rolls the whole group back: the level still points before it and the
group is applied again from its first fragment.  :class:`Held` is the writers'
shared bookkeeping; each writer begins, continues and ends the transaction its
own way (SQLite: one ``BEGIN IMMEDIATE`` spanning the pieces; PostgreSQL: a
``BEGIN`` whose pieces run as savepoints).  While a group is held the target's
write lock (SQLite) or the rows written so far (PostgreSQL) stay locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from subscriber.apply.errors import GapError
from subscriber.apply.writer import Step

__all__ = ["Held", "HeldWrites"]


class HeldWrites:
    """A writer's ``write``: its ``write_held`` committing at once (a base class)."""

    def write(
        self,
        subscription: str,
        incarnation: str,
        first_seq: int,
        last_seq: int,
        steps: Sequence[Step],
        reexecute: bool = False,  # a stored, skipped entry: see targets.metadata
    ) -> int:
        return self.write_held(
            subscription, incarnation, first_seq, last_seq, steps, commit=True, reexecute=reexecute
        )

    def write_held(
        self,
        subscription: str,
        incarnation: str,
        first_seq: int,
        last_seq: int,
        steps: Sequence[Step],
        *,
        commit: bool,
        reexecute: bool = False,
    ) -> int:
        raise NotImplementedError


@dataclass
class Held:
    """Which subscription holds the open group transaction, and its last seq so far."""

    subscription: str = ""
    last: int = 0

    @property
    def open(self) -> bool:
        return bool(self.subscription)

    def check(self, subscription: str, first_seq: int) -> None:
        """Refuse a piece that does not continue the held group (GapError)."""
        if subscription != self.subscription or first_seq != self.last + 1:
            raise GapError(
                f"piece starts at seq {first_seq} but the open group of "
                f"{self.subscription!r} ends at {self.last}",
                subscription=subscription,
                seq=first_seq,
            )

    def hold(self, subscription: str, last_seq: int) -> None:
        self.subscription, self.last = subscription, last_seq

    def clear(self) -> None:
        self.subscription, self.last = "", 0
