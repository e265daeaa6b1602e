"""Retention: purge whole log segments nobody needs, and enforce optional limits.

* Below the lowest level of the VALID subscribers of a publication, entries are
  applied everywhere they are wanted: whole segments at or below it are purged.
  A publication no subscriber has ever synced keeps everything (a new
  subscriber may start from seq 1); one whose subscribers are all invalid keeps
  only the segment holding the head.  Invalid subscribers do not hold the log
  back: they need a re-initialisation anyway.
* ``max_delta`` is enforced here too, not only when a subscriber reconnects: a
  valid subscriber with no live feed whose acked level lags the head by more
  than the publication's ``max_delta`` is marked invalid (error-level log line
  naming publication, subscriber, level, head) BEFORE the purge of the same
  pass, so a subscriber that synced once and vanished stops pinning the log on
  the next pass.  Two exemptions, both deliberate: a subscriber with a live
  feed (it is connected; the queue threshold cuts it if it falls behind, and
  its Hello is checked against max_delta when it comes back), and one an
  operator marked valid whose waiver has not ended yet (mark-valid promises it
  may catch up however far behind; ``txrepl admin drop-subscriber`` removes
  one that never comes back).  The live set is read on the event loop and
  handed to the pass, which runs in a worker thread.
* Optional limits (``retain_max_bytes``, ``retain_max_age_s`` per publication)
  purge further.  Valid subscribers that still needed the purged entries are
  marked invalid, and it is logged at error level: retention never drops an
  entry a valid subscriber needs silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

import structlog

from publisher.publication import Publication

if TYPE_CHECKING:  # the registry imports SQLAlchemy: not before capture runs (daemon.py)
    from publisher.registry import Registry, SubscriberRow

__all__ = ["apply_retention", "retention_loop"]

log = structlog.get_logger(__name__)


def apply_retention(
    pub: Publication, registry: Registry, live: Collection[tuple[str, str]] = ()
) -> int:
    """One retention pass over ``pub``; returns the number of entries purged.

    ``live`` holds the (publication, subscriber) pairs with a feed open now.  The
    pass holds ``pub.retention_lock``, so no subscriber is admitted (checked against
    the log's first entry and registered, feed.py) while it reads levels and purges.
    """
    with pub.retention_lock:
        return _retention_pass(pub, registry, live)


def _retention_pass(pub: Publication, registry: Registry, live: Collection[tuple[str, str]]) -> int:
    _enforce_max_delta(pub, registry, live)
    purged = 0
    low = registry.min_valid_level(pub.name)
    if low is None and registry.list_subscribers(pub.name):
        low = pub.log.head  # every subscriber is invalid: none holds the log back
    if low is not None and low >= pub.log.first_seq:
        purged += pub.log.purge(low)
    cfg = pub.config
    if cfg.retain_max_bytes or cfg.retain_max_age_s:
        before = pub.log.first_seq
        first = pub.log.enforce_limits(cfg.retain_max_bytes or None, cfg.retain_max_age_s or None)
        purged += max(0, first - before)
        for row in registry.list_subscribers(pub.name):
            if row.valid and row.level + 1 < first:
                reason = (
                    f"entries {row.level + 1}..{first - 1} it still needed were purged by the "
                    f"retention limits of publication {pub.name!r}"
                )
                _invalidate(
                    registry, row, reason, "retention limit invalidated a subscriber",
                    first_retained=first,
                )  # fmt: skip
    if purged:
        log.info(
            "log purged", publication=pub.name, entries=purged, first_retained=pub.log.first_seq
        )
    return purged


def _enforce_max_delta(
    pub: Publication, registry: Registry, live: Collection[tuple[str, str]]
) -> None:
    head = pub.log.head
    limit = pub.config.max_delta
    for row in registry.list_subscribers(pub.name):
        if not row.valid or row.waive_delta or (pub.name, row.subscriber) in live:
            continue
        if head - row.level <= limit:
            continue
        reason = (
            f"level {row.level} lags head {head} by {head - row.level} entries, more than "
            f"max_delta {limit} (found by retention while it was not connected)"
        )
        _invalidate(
            registry, row, reason, "retention invalidated a subscriber lagging more than max_delta",
            head=head, max_delta=limit,
        )  # fmt: skip


def _invalidate(
    registry: Registry, row: SubscriberRow, reason: str, event: str, **fields: int
) -> None:
    """Mark ``row`` invalid, loudly: an error line naming publication, subscriber, level."""
    registry.mark_invalid(row.publication, row.subscriber, reason)
    log.error(
        event,
        publication=row.publication,
        subscriber=row.subscriber,
        sync_level=row.level,
        **fields,
    )


async def retention_loop(
    publications: Mapping[str, Publication],
    registry: Registry,
    interval_s: float,
    live: Callable[[], Collection[tuple[str, str]]] = frozenset,
) -> None:
    while True:
        await asyncio.sleep(interval_s)
        for pub in publications.values():
            try:
                await asyncio.to_thread(apply_retention, pub, registry, frozenset(live()))
            except Exception:  # retention must never take the publisher down
                log.exception("retention pass failed", publication=pub.name)
