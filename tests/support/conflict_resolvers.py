"""User resolvers for the conflict tests, named in config as ``python:module:function``."""

from __future__ import annotations

from typing import Any


def merge_names(conflict: Any) -> tuple[str, dict[str, Any] | None]:
    """Apply a row of its own: the publisher's, its name joined with the target's."""
    pub, loc = conflict.publisher_row, conflict.local_row
    if pub is None or loc is None:
        return "take_publisher", None
    return "apply", {**pub, "name": f"{pub['name']}+{loc['name']}"}


def republish(conflict: Any) -> str:
    """Apply the publisher's row, as a local change of the target (re-published)."""
    return "republish"


def bad_decision(conflict: Any) -> str:
    """A resolver that answers no decision."""
    return "maybe"


def latest_row_wins(conflict: Any) -> str:
    """A pair's last-writer-wins on the rows' own ``(ts, node)``, a delete beating any
    update: the same decision on both nodes, so they converge (docs/topologies.md)."""
    pub, loc = conflict.publisher_row, conflict.local_row
    if loc is None:  # updated or deleted here, gone here: the delete wins
        return "ignore"
    if pub is None:  # deleted there
        return "take_publisher"
    newer = (pub["ts"], pub["node"]) > (loc["ts"], loc["node"])
    return "take_publisher" if newer else "ignore"


def merge_republish(conflict: Any) -> tuple[str, dict[str, Any] | None]:
    """Republish a row of its own, its ``v`` the publisher's joined with the target's:
    a row neither node had, so only a republish can bring it to the originator."""
    pub, loc = conflict.publisher_row, conflict.local_row
    if pub is None or loc is None:
        return "take_publisher", None
    return "republish", {**pub, "v": f"{pub['v']}+{loc['v']}"}
