"""Errors of a subscription's connection loop, and what the loop does with each.

Tree (rooted at :class:`common.errors.TxreplError`)::

    TxreplError
    ├── SubscriptionError              base of the loop's own errors
    │   ├── Interrupted                an operator paused or asked to reconnect, or
    │   │                              the daemon is stopping: control flow, no backoff
    │   └── SnapshotRequired           a new subscriber's seq 1 is gone (or the config
    │                                  says initial = "snapshot"): load a snapshot
    ├── TransientError
    │   └── FeedEnded                  the publisher cut the feed or refused us for now
    │                                  (unknown publication, timeout, unavailable):
    │                                  state disconnected, reconnect with backoff
    └── PermanentError
        └── PermanentFeedError         the conversation cannot go on without an
            │                          operator (gap, changed incarnation, publisher
            │                          behind our level, refused): state error
            └── InvalidSubscriber      the publisher marked us invalid: state invalid,
                                       until re-initialisation, mark-valid, reconnect

Errors of the other stages have their own trees: the apply's in
``subscriber.apply.errors`` (``ApplyError``: state error), the snapshot loader's
``SnapshotRefused`` in ``subscriber.reinit``.  Which refusal of the publisher
becomes which error is decided by its kind, in ``subscriber.stream``.
"""

from __future__ import annotations

from common.errors import PermanentError, TransientError, TxreplError

__all__ = [
    "FeedEnded",
    "Interrupted",
    "InvalidSubscriber",
    "PermanentFeedError",
    "SnapshotRequired",
    "SubscriptionError",
]


class SubscriptionError(TxreplError):
    """Base of the connection loop's own errors."""


class Interrupted(SubscriptionError):
    """An operator paused, asked to reconnect, or the daemon is stopping."""


class SnapshotRequired(SubscriptionError):
    """The publisher no longer has seq 1 for this new subscriber."""


class FeedEnded(TransientError):
    """The feed ended or was refused for now: reconnect with backoff."""


class PermanentFeedError(PermanentError):
    """The conversation cannot go on without an operator."""


class InvalidSubscriber(PermanentFeedError):
    """The publisher marked us invalid."""
