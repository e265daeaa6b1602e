"""Logging, configured once per process: structlog, JSON off a terminal.

One canonical line per unit of work (a batch, a cut, a state change).  Secrets
never reach a log line: keys that look like credentials are masked by
:func:`_mask_secrets` before rendering.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["configure_logging"]

_SECRET_WORDS = ("token", "password", "passwd", "secret", "credential", "authorization")


def _is_secret(key: object) -> bool:
    return isinstance(key, str) and _secret_name(key)


@functools.lru_cache(maxsize=1024)
def _secret_name(key: str) -> bool:
    """Whether a key names a secret: asked per key of every line, answered once per key
    (a line's keys are a few dozen names, and the test cost ~1 us a key)."""
    return any(w in key.lower() for w in _SECRET_WORDS)


def _masked(value: Any, depth: int = 0) -> Any:
    """``value`` with secret-named keys masked, also inside nested tables and lists."""
    if depth > 5:
        return value
    if isinstance(value, dict):
        return {
            k: ("***" if _is_secret(k) and v else _masked(v, depth + 1)) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_masked(v, depth + 1) for v in value]
    return value


_NESTED = (dict, list, tuple)


@functools.lru_cache(maxsize=1024)
def _secret_keys(keys: tuple[str, ...]) -> tuple[str, ...]:
    """The keys of a line that name secrets, decided once per set of keys: a process
    logs a few dozen kinds of line, and the subscriber one per batch (issue 23: asking
    per key cost 4 of a batch line's 16 µs)."""
    return tuple(k for k in keys if _is_secret(k))


def _mask_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    secret = _secret_keys(tuple(event))
    for key in secret:
        if event[key]:
            event[key] = "***"
    for key, value in event.items():  # values replaced, no key added: safe to iterate
        if isinstance(value, _NESTED):
            event[key] = _masked(value)
    return event


def configure_logging(level: str = "info", *, json: bool | None = None, stream: Any = None) -> None:
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _mask_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=stream)
