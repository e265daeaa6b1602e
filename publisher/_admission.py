"""Admitting a Sync stream: the checks of its Hello against the publication's log.

:func:`admit` runs the purge and max-delta checks of a Hello and registers the
subscriber, under the publication's retention lock (so a retention pass cannot purge
between the check and the registration), in a worker thread; it returns the refusal
to raise, if any.  The refusals and their status codes are the wire contract's
(common/feedstatus.py); publisher/feed.py runs the stream itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from common.feedstatus import REFUSAL_CODES, RefusalKind
from common.rpc import txrepl_pb2 as pb
from publisher.errors import FeedRefused
from publisher.publication import Publication

if TYPE_CHECKING:  # the registry imports SQLAlchemy: not before capture runs (daemon.py)
    from publisher.registry import Registry

__all__ = ["INVALID_PREFIX", "admit", "refused"]

log = structlog.get_logger("publisher.feed")

INVALID_PREFIX = "subscriber is invalid"  # the message of REFUSAL_KIND_INVALID starts so


def refused(kind: RefusalKind, message: str) -> FeedRefused:
    """A refusal of ``kind``, with the status code the wire contract gives it."""
    return FeedRefused(REFUSAL_CODES[kind], message, kind=kind)


def admit(registry: Registry, pub: Publication, hello: pb.Hello) -> FeedRefused | None:
    """The purge and max-delta checks of a Hello, and the subscriber's
    registration, under the publication's retention lock (in a worker thread);
    the refusal to raise, if any."""
    plog = pub.log
    head = plog.head
    with pub.retention_lock:
        if (
            hello.level == 0
            and not hello.incarnation
            and plog.first_seq > 1
            and registry.get(pub.name, hello.subscriber) is None
        ):
            # A new subscriber after a purge: nothing to invalidate, it needs a snapshot.
            return refused(
                pb.REFUSAL_KIND_SNAPSHOT_REQUIRED,
                f"snapshot required: entries 1..{plog.first_seq - 1} of {pub.name!r} were "
                'purged; start this subscriber from a snapshot (initial = "auto" or '
                "\"snapshot\", or 'txrepl subscriber reinit')",
            )
        reg = registry.ensure(pub.name, hello.subscriber, plog.incarnation, hello.level)
        if not reg.valid:
            return refused(
                pb.REFUSAL_KIND_INVALID,
                f"{INVALID_PREFIX}: {reg.invalid_reason}; re-initialise it, then run "
                f"'txrepl admin mark-valid {pub.name} {hello.subscriber}'",
            )
        reason = ""
        if hello.level + 1 < plog.first_seq:
            first = plog.first_seq
            reason = f"its next entry {hello.level + 1} was purged (first retained: {first})"
        elif head - hello.level > pub.config.max_delta and not reg.waive_delta:
            reason = (
                f"level {hello.level} lags head {head} by {head - hello.level} entries, "
                f"more than max_delta {pub.config.max_delta}"
            )
        if reason:
            registry.mark_invalid(pub.name, hello.subscriber, reason)
            log.warning(
                "subscriber marked invalid",
                publication=pub.name,
                subscriber=hello.subscriber,
                reason=reason,
            )
            return refused(
                pb.REFUSAL_KIND_INVALID,
                f"{INVALID_PREFIX}: {reason}; re-initialise it, then run "
                f"'txrepl admin mark-valid {pub.name} {hello.subscriber}'",
            )
        return None
