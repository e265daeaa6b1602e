"""Errors of a snapshot load (re-initialisation).

Tree (rooted at :class:`common.errors.TxreplError`)::

    TxreplError
    └── SnapshotError            the snapshot could not be loaded; the target is
        │                        unchanged (a later attempt may work)
        └── SnapshotRefused      the configuration rules the snapshot out (a table in
                                 history mode): retrying cannot help; also a
                                 common.errors.PermanentError

Raised by the stream client (:mod:`subscriber.reinit.client`), the transforms
(:mod:`subscriber.reinit.shape`) and each target's shadow-table loader
(``subscriber.targets.<dialect>.snapshot``), which translates its driver's errors.
"""

from __future__ import annotations

from common import errors as common

__all__ = ["SnapshotError", "SnapshotRefused"]


class SnapshotError(common.TxreplError):
    """The snapshot could not be loaded; the target is unchanged."""


class SnapshotRefused(SnapshotError, common.PermanentError):
    """The configuration rules the snapshot out (a retry cannot help)."""
