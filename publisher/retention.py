"""Retention: purge whole log segments nobody needs, and enforce optional limits.

* Below the lowest level of the VALID subscribers of a publication, entries are
  applied everywhere they are wanted: whole segments at or below it are purged.
  A publication no subscriber has ever synced keeps everything (a new
  subscriber may start from seq 1).  Invalid subscribers do not hold the log
  back: they need a re-initialisation anyway.
* Optional limits (``retain_max_bytes``, ``retain_max_age_s`` per publication)
  purge further.  Valid subscribers that still needed the purged entries are
  marked invalid, and it is logged at error level: retention never drops an
  entry a valid subscriber needs silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog

from publisher.publication import Publication
from publisher.registry import Registry

__all__ = ["apply_retention", "retention_loop"]

log = structlog.get_logger(__name__)


def apply_retention(pub: Publication, registry: Registry) -> int:
    """One retention pass over ``pub``; returns the number of entries purged."""
    purged = 0
    low = registry.min_valid_level(pub.name)
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
                registry.mark_invalid(pub.name, row.subscriber, reason)
                log.error(
                    "retention limit invalidated a subscriber",
                    publication=pub.name,
                    subscriber=row.subscriber,
                    sync_level=row.level,
                    first_retained=first,
                )
    if purged:
        log.info(
            "log purged", publication=pub.name, entries=purged, first_retained=pub.log.first_seq
        )
    return purged


async def retention_loop(
    publications: Mapping[str, Publication], registry: Registry, interval_s: float
) -> None:
    while True:
        await asyncio.sleep(interval_s)
        for pub in publications.values():
            try:
                await asyncio.to_thread(apply_retention, pub, registry)
            except Exception:  # retention must never take the publisher down
                log.exception("retention pass failed", publication=pub.name)
