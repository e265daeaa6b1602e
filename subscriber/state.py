"""What one subscription is doing: its state, timeline, level and counters.

States and transitions (each logged and kept, timestamped, in the timeline)::

    disconnected ──▶ connecting ──Welcome──▶ syncing ──InSync──▶ in_sync
         ▲               │                      │                   │
         └──backoff──────┴──── stream ends / cut / transient error ─┘
    paused   : by the control service; no connection until resumed
    scheduled: a scheduled subscription between runs; it connects at the next
               scheduled time, syncs until in sync, then disconnects
    error    : a permanent failure (gap, changed incarnation, publisher behind our
               level, apply failure); waits for an operator's reconnect
    invalid  : the publisher refused us as invalid; waits for re-initialisation,
               mark-valid, then a reconnect
    broken   : ``retry_budget`` attempts in a row failed (publisher unreachable,
               refused, ...); logged as an error, no more attempts until an
               operator's unbreak (Oracle's broken job), then ``disconnected``

In sync means: the publisher said InSync(head) on this stream, and our level
has reached that head (:meth:`SubscriptionState.at_head`); the stream notices
the first when the level is already there, the apply pipeline the second.

The supervisor (subscriber.subscription) drives the transitions; the stream and
the pipeline update the level and head.  :meth:`SubscriptionState.status` is
what the control service and ``txrepl subscriber status`` show.
"""

from __future__ import annotations

import time

import structlog

from common.rpc import txrepl_pb2 as pb

__all__ = ["STATES", "SubscriptionState"]

log = structlog.get_logger(__name__)

STATES = (
    "disconnected",
    "connecting",
    "syncing",
    "in_sync",
    "paused",
    "error",
    "invalid",
    "scheduled",
    "broken",
)

_TIMELINE = 100  # transitions kept; status shows the last 20


class SubscriptionState:
    """The observable state of one subscription (single-threaded: the event loop)."""

    def __init__(self, name: str, level: int, incarnation: str) -> None:
        self.name = name
        self.state = "disconnected"
        self.timeline: list[tuple[float, str, str]] = [(time.time(), "disconnected", "started")]
        self.last_error = ""
        self.level = level  # the last seq applied (read from the target)
        self.incarnation = incarnation
        self.head = level  # the publication's head, as last heard
        self.applied_entries = 0
        self.applied_rows = 0
        self.sessions = 0  # streams that got as far as a Welcome
        self.in_sync_head: int | None = None  # InSync(head) of the current stream

    def set(self, state: str, reason: str = "") -> None:
        """Move to ``state`` (logged, and kept in the timeline)."""
        if state == self.state and not reason:
            return
        prev, self.state = self.state, state
        self.timeline.append((time.time(), state, reason))
        del self.timeline[:-_TIMELINE]
        log.info(
            "subscription state",
            subscription=self.name,
            state=state,
            previous=prev,
            reason=reason,
            sync_level=self.level,
        )

    def fail(self, state: str, error: str) -> None:
        """Move to ``state`` because of ``error`` (kept as the last error)."""
        self.last_error = error
        self.set(state, error)

    @property
    def in_sync(self) -> bool:
        return self.state == "in_sync"

    def at_head(self) -> bool:
        """True when this stream said InSync and our level has reached its head."""
        return self.in_sync_head is not None and self.level >= self.in_sync_head

    def enter_in_sync(self) -> None:
        # A transition, not every batch applied at the head: the timeline keeps the
        # last 100 changes, and a busy in-sync feed would flush everything else out.
        if self.state != "in_sync":
            # Recovered: status no longer shows the error beside in_sync (the
            # timeline keeps it, with the time it happened).
            self.last_error = ""
            self.set("in_sync", f"head {self.in_sync_head}")

    def status(self, publisher: str, publication: str) -> pb.SubscriptionStatus:
        """The status message of the control service."""
        st = pb.SubscriptionStatus(
            name=self.name,
            publisher=publisher,
            publication=publication,
            state=self.state,
            level=self.level,
            head=max(self.head, self.level),
            last_error=self.last_error,
            applied_entries=self.applied_entries,
            applied_rows=self.applied_rows,
            sessions=self.sessions,
        )
        for at, state, reason in self.timeline[-20:]:
            st.timeline.add(state=state, at_us=int(at * 1e6), reason=reason)
        return st
