"""Stored errors (``txrepl_errors``): list, retry and skip -- for operators and the CLI.

An entry lands there when it fails on its own (see :mod:`subscriber.apply.engine`).
``skip`` moves the level past a stored entry without applying it.  ``retry``
applies a stored entry after the operator fixed its cause, in one of two ways:

* **in order** (status ``open``, the level just before it: ``error_policy = "stop"``
  stopped there): the entry is applied as the next batch, moving the level;
* **re-execution** (status ``skipped``, the level already past it: the skip
  policy, or an operator's skip, let later entries apply).  This is Oracle's
  deferred-error queue, which the seed asks for: "an error will be written to
  deferror with full details so that it can be re-executed when the problem is
  resolved, and the others will be applied".  The entry runs alone in its own
  target transaction, under the level lock, which leaves the level where it is
  and marks the entry ``applied`` in that same transaction (so it runs at most
  once; see :mod:`subscriber.targets.metadata`).

What re-execution means for the net effect: the entry's changes are applied *as
they are*, now, on top of everything applied since -- not re-ordered back into
the stream.  Each row change is an upsert of the entry's row image (or a delete of
its key), as Oracle re-executes the deferred transaction's statements.  So the
target equals the source when no later entry touched the same keys (the usual
case: the failure was a target-side rule the later entries did not trip); when
later entries did change those keys, the entry's older images overwrite the newer
ones, and the operator should skip it (or re-initialise) instead.  We rejected
replaying every entry after it (the log may no longer hold them, and it would
undo nothing the target's own rules did differently) and refusing re-execution
once later entries are applied (then a skipped entry could never be applied,
which is the issue).  The entry is planned against the schemas the target
records now; a re-execution that fails changes nothing and keeps it ``skipped``.
"""

from __future__ import annotations

import time

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.engine import Applier, ApplyResult
from subscriber.apply.errors import ApplyError
from subscriber.apply.writer import StoredError, Writer

__all__ = ["list_errors", "retry_error", "skip_error"]


def list_errors(writer: Writer, subscription: str | None = None) -> list[StoredError]:
    """Every stored error (of one subscription, or all), in (subscription, seq) order."""
    return writer.list_errors(subscription)


def _find(writer: Writer, subscription: str, seq: int) -> StoredError:
    for e in writer.list_errors(subscription):
        if e.seq == seq:
            return e
    raise ApplyError("no stored error", subscription=subscription, seq=seq)


def retry_error(applier: Applier, seq: int) -> ApplyResult:
    """Apply stored entry ``seq`` now; on success it is marked ``applied``.

    An ``open`` entry needs the level at ``seq - 1`` and moves it to ``seq``; a
    ``skipped`` one the level has passed is re-executed (the level stays).
    Raises :class:`ApplyError` if there is nothing to retry there, and
    :class:`PoisonEntryError` (in order) or :class:`ApplyError` (re-execution) if it
    fails again.
    """
    stored = _find(applier.writer, applier.subscription, seq)
    if stored.status == "applied":
        raise ApplyError("already applied", subscription=applier.subscription, seq=seq)
    state = applier.load_state()
    if stored.status == "skipped" and state.level >= seq:
        return _reexecute(applier, seq, pb.Entry.FromString(stored.entry), state.incarnation)
    if state.level != seq - 1:
        raise ApplyError(
            f"the level is {state.level}, not {seq - 1}: only the entry right after the "
            "level, or a skipped one the level has passed, can be retried",
            subscription=applier.subscription,
            seq=seq,
        )
    result = applier.apply(seq, [pb.Entry.FromString(stored.entry)], incarnation=state.incarnation)
    applier.writer.mark_error(applier.subscription, seq, "applied")
    return result


def _reexecute(applier: Applier, seq: int, entry: pb.Entry, incarnation: str) -> ApplyResult:
    started = time.perf_counter()
    planned = applier.plan(seq, [entry])
    if planned.error is not None or planned.steps is None:
        raise ApplyError(
            f"cannot plan the stored entry: {planned.error}",
            subscription=applier.subscription,
            seq=seq,
        )
    written = applier.writer.write(
        applier.subscription, incarnation, seq, seq, planned.steps, reexecute=True
    )
    level = applier.load_state().level
    return ApplyResult(level, planned.rows, written, 1, time.perf_counter() - started)


def skip_error(writer: Writer, subscription: str, seq: int) -> int:
    """Mark stored entry ``seq`` skipped, moving the level past it; returns the level."""
    return writer.skip_error(subscription, seq)
