"""Conflict resolvers as the subscriber config names them (light: no drivers, no Spark).

A subscription is *updatable* when its ``conflicts`` key names a resolver; its
tables are then checked for conflicts when applying (docs/conflicts.md).  A resolver
is one of::

    publisher_wins            the publisher's change is applied (the default)
    subscriber_wins           the target's row is kept, the publisher's change dropped
    latest_commit_wins        the later of the publisher's commit time and the target
                              row's ``conflict_time_column`` wins
    python:pkg.module:func    a Python callable (subscriber.targets.conflicts.Conflict
                              -> decision name, or (decision, row))
    sql:<expression>          a SQL expression over ``pub.<column>`` and ``loc.<column>``
                              evaluated on the target, giving a decision name

``off`` (per table only) turns detection off for that table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BUILTIN", "DECISIONS", "ResolverSpec", "parse_resolver"]

BUILTIN = ("publisher_wins", "subscriber_wins", "latest_commit_wins")
# take_publisher: the publisher's change as sent; ignore: keep the target's row;
# apply: the resolver's row (it may change it); republish: apply it as a local change
# (captured by a publication of this target, so it goes on to everyone).
DECISIONS = ("take_publisher", "ignore", "apply", "republish")


@dataclass(frozen=True)
class ResolverSpec:
    """A parsed resolver: ``kind`` is a built-in name, ``python`` or ``sql``."""

    text: str
    kind: str
    sql: str = ""
    func: Callable[..., Any] | None = None


def parse_resolver(text: str, *, field: str) -> ResolverSpec:
    """The resolver ``text`` names; ValueError naming ``field`` and the forms if bad."""
    if text in BUILTIN:
        return ResolverSpec(text, text)
    if text.startswith("sql:") and text[4:].strip():
        return ResolverSpec(text, "sql", sql=text[4:].strip())
    if text.startswith("python:"):
        module, _, name = text[7:].partition(":")
        if not module or not name:
            raise ValueError(f"{field}: write python:package.module:function, not {text!r}")
        try:
            func = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"{field}: cannot load {text[7:]!r} ({exc})") from None
        if not callable(func):
            raise ValueError(f"{field}: {text[7:]!r} is not callable")
        return ResolverSpec(text, "python", func=func)
    raise ValueError(
        f"{field}: unknown resolver {text!r}; use one of {', '.join(BUILTIN)}, "
        "python:module:function or sql:<expression>"
    )
