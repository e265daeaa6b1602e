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
