"""The ``txrepl_errors`` half of every target writer, written once.

A writer stores an entry that failed on its own (park), lists the stored ones,
skips one (moving the level past it when it is next) and marks one ``applied``
after a retry or a re-execution (:mod:`subscriber.apply.stored`).  The SQL and
the rules (what a skip may move, the level check of a park) are
:class:`~subscriber.targets.metadata.MetadataSql`'s, per dialect; what differs
between targets is only how a statement runs, so a writer mixes in
:class:`ErrorQueue` and gives it three things:

``_metadata``
    its dialect's :class:`MetadataSql` (a class attribute);
``_in_transaction(subscription, seq, body)``
    ``body(cursor)`` in one write transaction, holding the writer's lock,
    committed, its driver errors translated (``TransientError`` / ``WriterError``);
``_read(body, subscription)``
    ``body(cursor)`` as a read, called with the writer's ``_lock`` held, driver
    errors translated.

Parking and skipping lock the level row (they may move the level); marking runs
in a transaction of its own, so a status is never left half-written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

from subscriber.apply.writer import StoredError
from subscriber.targets.metadata import Executor, MetadataSql

__all__ = ["ErrorQueue"]

Body = Callable[[Executor], Any]


class ErrorQueue:
    """``record_error``, ``list_errors``, ``skip_error``, ``mark_error`` of a Writer."""

    _metadata: ClassVar[MetadataSql]
    _lock: threading.Lock

    def _in_transaction(self, subscription: str, seq: int, body: Body) -> Any:
        raise NotImplementedError

    def _read(self, body: Body, subscription: str | None = None) -> Any:
        raise NotImplementedError

    def record_error(
        self,
        subscription: str,
        incarnation: str,
        seq: int,
        entry: bytes,
        error: str,
        *,
        skip: bool,
    ) -> None:
        self._in_transaction(
            subscription,
            seq,
            lambda cur: self._metadata.record_error(
                cur, subscription, incarnation, seq, entry, error, skip=skip
            ),
        )

    def list_errors(self, subscription: str | None = None) -> list[StoredError]:
        with self._lock:
            out: list[StoredError] = self._read(
                lambda cur: self._metadata.list_errors(cur, subscription), subscription
            )
            return out

    def skip_error(self, subscription: str, seq: int) -> int:
        level: int = self._in_transaction(
            subscription, seq, lambda cur: self._metadata.skip_error(cur, subscription, seq)
        )
        return level

    def mark_error(self, subscription: str, seq: int, status: str) -> None:
        self._in_transaction(
            subscription,
            seq,
            lambda cur: self._metadata.mark_error(cur, subscription, seq, status),
        )
