"""Errors of the apply engine.

Tree (rooted at :class:`common.errors.TxreplError`)::

    TxreplError
    ├── ApplyError               a batch was not applied; the target is unchanged
    │   ├── GapError             first_seq != level + 1 (or the incarnation changed)
    │   │   └── NodeAppeared     the target was recorded as a node after the batch was
    │   │                        planned as for none: planned again (engine.py)
    │   ├── SchemaError          a row does not fit its table's schema, or no schema
    │   │                        yet, or a transform's expression does not analyse
    │   ├── WriterError          the target refused the batch (constraint, I/O, lock)
    │   │   └── TransientError   ... for a reason that may pass (connection lost, lock
    │   │                        timeout, serialization failure, deadlock): retried;
    │   │                        also a common.errors.TransientError
    │   └── PoisonEntryError     one entry fails on its own, persistently: the entries
    │                            before it were applied (level = seq - 1) and it is
    │                            stored whole in the target's ``txrepl_errors``
    └── SparkError               Spark could not do the apply's work (translated from
        │                        py4j / pyspark, subscriber/apply/_spark.py); not an
        │                        ApplyError: never narrowed nor stored, the
        │                        subscription reconnects and tries the batch again
        ├── SparkUnavailable     the gateway or the JVM is gone; also a
        │                        common.errors.TransientError
        ├── SparkJobError        a job failed (executors lost, a task error); also a
        │                        common.errors.TransientError
        └── SparkQueryError      Spark refused a query (AnalysisException); also a
                                 common.errors.PermanentError

Foreign errors are translated where they arise: the driver's in each target's
writer (``subscriber.targets``), py4j's and Spark's at the Spark boundary
(:mod:`subscriber.apply._spark`).

Every error names the subscription and, where known, the seq and the table.  The
target transaction is always rolled back before one is raised, so the stored level
and rows are exactly as before the call -- except for :class:`PoisonEntryError`,
raised after the good prefix of the batch was committed (its ``level`` says where
the target now stands).
"""

from __future__ import annotations

from common import errors as common

__all__ = [
    "ApplyError",
    "GapError",
    "NodeAppeared",
    "PoisonEntryError",
    "SchemaError",
    "SparkError",
    "SparkJobError",
    "SparkQueryError",
    "SparkUnavailable",
    "TransientError",
    "WriterError",
]


class ApplyError(common.TxreplError):
    """A batch could not be applied; nothing of it reached the target."""

    def __init__(
        self,
        message: str,
        *,
        subscription: str = "",
        seq: int | None = None,
        table: str | None = None,
    ) -> None:
        parts = [message]
        ctx = []
        if subscription:
            ctx.append(f"subscription={subscription!r}")
        if seq is not None:
            ctx.append(f"seq={seq}")
        if table is not None:
            ctx.append(f"table={table!r}")
        if ctx:
            parts.append(f"({', '.join(ctx)})")
        super().__init__(" ".join(parts))
        self.subscription = subscription
        self.seq = seq
        self.table = table


class GapError(ApplyError):
    """The batch does not continue the stored level, or belongs to another incarnation."""


class NodeAppeared(GapError):
    """The target's node was recorded since the writer last found none: the batch,
    planned as for a target that is no node, was rolled back (subscriber/targets/
    nodewatch.py); the engine reads the node and applies it again."""


class SchemaError(ApplyError):
    """A row change names an unknown table or does not match the table's schema."""


class WriterError(ApplyError):
    """The target database refused the batch (translated from the driver's error)."""


class TransientError(WriterError, common.TransientError):
    """The target failed for a reason that may pass: retrying the same batch may work."""


class PoisonEntryError(ApplyError):
    """Entry ``seq`` fails on its own; the entries before it are applied (``level``).

    The entry is stored whole in the target's ``txrepl_errors`` table with ``error``
    (the text of the underlying failure); ``cause`` is that failure.
    """

    def __init__(
        self, *, subscription: str, seq: int, level: int, error: str, cause: ApplyError
    ) -> None:
        super().__init__(
            f"entry {seq} cannot be applied and was stored in txrepl_errors "
            f"(level is now {level}): {error}",
            subscription=subscription,
            seq=seq,
        )
        self.level = level
        self.error = error
        self.cause = cause


class SparkError(common.TxreplError):
    """Spark could not do the apply's work (see :mod:`subscriber.apply._spark`)."""


class SparkUnavailable(SparkError, common.TransientError):
    """Spark's gateway or JVM is gone: a new session (or the cluster's return) may help."""


class SparkJobError(SparkError, common.TransientError):
    """A Spark job failed (executors lost, a task error): running it again may work."""


class SparkQueryError(SparkError, common.PermanentError):
    """Spark refused a query (it does not analyse): retrying cannot help."""
