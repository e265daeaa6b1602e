"""Errors of the apply engine.

Tree::

    ApplyError                 a batch was not applied; the target is unchanged
    ├── GapError               first_seq != level + 1 (or the incarnation changed)
    ├── SchemaError            a row does not fit its table's schema, or no schema yet
    └── WriterError            the target refused the batch (constraint, I/O, lock)

Every error names the subscription and, where known, the seq and the table.  The
target transaction is always rolled back before one is raised, so the stored level
and rows are exactly as before the call.
"""

from __future__ import annotations

__all__ = ["ApplyError", "GapError", "SchemaError", "WriterError"]


class ApplyError(Exception):
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


class SchemaError(ApplyError):
    """A row change names an unknown table or does not match the table's schema."""


class WriterError(ApplyError):
    """The target database refused the batch (translated from the driver's error)."""
