"""Stored errors (``txrepl_errors``): list, retry and skip -- for operators and the CLI.

An entry lands there when it fails on its own (see :mod:`subscriber.apply.engine`).
``retry`` applies the stored entry again (after the operator fixed the target) and
marks it ``applied``; ``skip`` moves the level past it without applying it.  Both
act only where the subscription stands: the level must be just before the entry.
"""

from __future__ import annotations

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

    Raises :class:`ApplyError` if the level is not ``seq - 1`` (nothing to retry
    there), and :class:`PoisonEntryError` if it fails again (the stored error text
    is then updated).
    """
    stored = _find(applier.writer, applier.subscription, seq)
    if stored.status == "applied":
        raise ApplyError("already applied", subscription=applier.subscription, seq=seq)
    state = applier.load_state()
    if state.level != seq - 1:
        raise ApplyError(
            f"the level is {state.level}, not {seq - 1}: only the entry right after the "
            "level can be retried",
            subscription=applier.subscription,
            seq=seq,
        )
    result = applier.apply(seq, [pb.Entry.FromString(stored.entry)], incarnation=state.incarnation)
    applier.writer.mark_error(applier.subscription, seq, "applied")
    return result


def skip_error(writer: Writer, subscription: str, seq: int) -> int:
    """Mark stored entry ``seq`` skipped, moving the level past it; returns the level."""
    return writer.skip_error(subscription, seq)
