"""The deferred-error queue through a running subscriber's control service.

The same operations as ``txrepl subscriber errors`` (subscriber.apply.stored), run by
the daemon on its own Spark session and target.  They use a separate
:class:`Applier` on the runner's SparkSession and writer, never the runner's own
(its pipeline may be planning in another thread); the writer's lock and the level
check in each target transaction keep the two apart.

* retry of an ``open`` entry (the subscription stopped before it, in ``error``):
  applied as the next batch, then the runner reconnects to read its new level;
* retry of a ``skipped`` entry the level has passed: re-executed in its own target
  transaction; the level and the runner are left alone;
* skip: the level moves past an ``open`` entry, then the runner reconnects.
"""

from __future__ import annotations

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier
from subscriber.apply.stored import list_errors, retry_error, skip_error
from subscriber.subscription import SubscriptionRunner

__all__ = ["errors_of", "retry_in_daemon", "skip_in_daemon"]


def errors_of(runners: list[SubscriptionRunner]) -> pb.ErrorsResponse:
    out = pb.ErrorsResponse()
    for r in runners:
        for e in list_errors(r.applier.writer, r.name):
            out.errors.add(
                subscription=e.subscription,
                seq=e.seq,
                status=e.status,
                error=e.error,
                created_at=e.created_at,
            )
    return out


def retry_in_daemon(runner: SubscriptionRunner, seq: int) -> None:
    """Retry stored entry ``seq`` (raises ApplyError, one line, when refused or failing)."""
    own = runner.applier
    applier = Applier(own.spark, own.writer, runner.name, options=own.options)
    before = applier.load_state().level
    retry_error(applier, seq)
    if applier.load_state().level != before:
        runner.reconnect()


def skip_in_daemon(runner: SubscriptionRunner, seq: int) -> None:
    """Skip stored entry ``seq``; the runner reconnects to read the level."""
    skip_error(runner.applier.writer, runner.name, seq)
    runner.reconnect()
