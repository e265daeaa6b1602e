"""Health per component, in gRPC health, ``/metrics`` and the logs, from one reading.

Each daemon names its components and says, at each reading, whether each one
serves and whether the daemon as a whole does (``""``, the service a plain
health check asks about, and the one container health checks use):

============  =====================================  ==================================
daemon        component (gRPC health service name)   the whole daemon (``""``)
============  =====================================  ==================================
publisher     ``txrepl.capture.<publication>``       NOT_SERVING while any capture
              NOT_SERVING while that publication's   fails (a publisher that captures
              capture fails in a loop                nothing serves stale logs)
subscriber    ``txrepl.subscription.<id>``           NOT_SERVING when every
              NOT_SERVING in ``error`` or            subscription is (none works)
              ``invalid`` (it waits for a person)
============  =====================================  ==================================

The daemon's own services (``txrepl.v1.Replication``, ...) stay SERVING until
the drain: the port still answers, and a client asking for them asks whether
the call can be made.

:func:`health_loop` reads every :data:`INTERVAL_S`, sets what changed in the
endpoint's health servicer (watchers are told at once) and logs each change
once; :class:`HealthBoard` keeps the last reading for ``/metrics``
(``txrepl_health_serving{service}``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import structlog

from common import metrics
from common.serve import GrpcEndpoint

__all__ = ["INTERVAL_S", "HealthBoard", "Reading", "health_loop"]

log = structlog.get_logger(__name__)

INTERVAL_S = 0.5

# (the whole daemon serves, {component service name: serves}, {component: why not})
Reading = tuple[bool, dict[str, bool], dict[str, str]]


class HealthBoard:
    """The last reading of each health service ('' included), for metrics."""

    def __init__(self) -> None:
        self.serving: dict[str, bool] = {}

    def collect(self) -> Iterator[Any]:
        family = metrics.gauge("txrepl_health_serving")
        for name, ok in sorted(self.serving.items()):
            family.add_metric([name], 1 if ok else 0)
        yield family


async def health_loop(
    endpoint: GrpcEndpoint,
    read: Callable[[], Reading],
    board: HealthBoard,
    interval_s: float = INTERVAL_S,
) -> None:
    """Until cancelled: set each health service from ``read()`` (module docstring)."""
    while True:
        try:
            overall, components, why = read()
        except Exception:  # a reading gone wrong must not end health reporting
            log.exception("health: cannot read the components")
            overall, components, why = False, {}, {"": "health cannot be read"}
        for name, ok in [("", overall), *sorted(components.items())]:
            if board.serving.get(name) == ok:
                continue
            first = name not in board.serving
            board.serving[name] = ok
            await endpoint.set_health(name, ok)
            shown = name or "(whole daemon)"
            if not ok:
                log.warning("health: NOT_SERVING", service=shown, reason=why.get(name, ""))
            elif not first:
                log.info("health: SERVING again", service=shown)
        await asyncio.sleep(interval_s)
