"""Constraint-safe order of a batch's rows steps (issue 20).

The net effect (``_plan.py``) writes, per table and segment, the deletes then the
upserts of the surviving events, in no particular key order.  That is exact for
the *final* state, but a target checks its constraints row by row (PostgreSQL's
non-deferrable unique indexes, every SQLite constraint), so the *intermediate*
states of the write must be acceptable too, and "events of different keys
commute" is false under them: a swap of two emails through a temporary value,
netted to two upserts, makes the first upsert collide with the row the second
would have changed.

Which constraints can refuse an intermediate state, and the order each needs:

* **CHECK** (and NOT NULL): a property of one row.  Every row written is a row
  the source held at the segment's end, which satisfied it.  Never refused; no
  order needed.
* **Foreign keys**: not enforced by replicated writes, on both targets.  A
  PostgreSQL writer runs under ``session_replication_role = replica`` (the
  default), which silences the foreign keys' system triggers (checks, and
  CASCADE / SET NULL actions alike); the SQLite writer's connection runs with
  ``PRAGMA foreign_keys = OFF``, its equivalent.  Every row change the source's
  own cascades made is in the stream (SQLite capture triggers fire for cascaded
  rows, logical decoding logs them), so the target ends equal to the source
  whatever the order, and a target's own CASCADE never deletes a row twice or
  one the source kept.  (Rejected: enforcing them and ordering the steps
  topologically, upserts parents-first then deletes children-first: it fails on
  self-references and cycles, and it contradicts the order unique constraints
  need, below.  Under ``replication_role = origin|local`` a PostgreSQL target
  checks its foreign keys, as the operator asked; see docs/apply.md.)
* **UNIQUE** (secondary unique constraints and unique indexes, partial or on
  expressions) and PostgreSQL **EXCLUDE** constraints: a set of rows that
  satisfies them keeps satisfying them when rows are removed ("subset-closed").
  For a table holding one, a rows step is written as **delete every key the
  segment touched** (its deletes and the keys of its upserts), **then insert
  the surviving rows**.  Argument: at the segment's start the target table
  equals the source's (induction over the batch's steps, which keep their
  order); after the deletes it holds only rows with no event in the segment,
  which the source still holds unchanged at the segment's end; each insert adds
  one of the source's final rows, so every intermediate state is a subset of
  the source's state at the segment's end, which satisfies the constraint;
  constraints are per table, so the order of the tables' steps does not matter.
  Any batch, however cut, any cycle length, within one source transaction or
  across many: the cost is one more set-based DELETE per such table and
  segment, and the inserts then take the writers' plain-insert path
  (``RowsStep.fresh``).  PostgreSQL constraints ``INITIALLY DEFERRED`` are
  checked at commit, against the final state: they need nothing.

Tables without such constraints keep the upsert path unchanged.  Which tables
have them is read from the target's catalog (``Writer.ordered_tables``: SQLite
``pragma index_list``, PostgreSQL ``pg_index`` / ``pg_constraint``) and cached
here; the cache is forgotten after a batch that carried DDL (a schema step, an
SQL statement, a procedure call) and after any failed write, so a constraint an
operator adds by hand is seen at the latest when it first refuses a batch (the
halves of the narrowed batch then apply in the safe order).

Triggers: the target's triggers do not fire for replicated rows (both writers);
an ``ALWAYS`` trigger on such a table sees a delete and an insert where the
source had an update.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.writer import CallStep, RowsStep, SchemaStep, SqlStep, Step

__all__ = ["ConstraintOrder", "OrderedTables"]


class OrderedTables(Protocol):
    """The part of a writer that reads which tables need the safe order."""

    def ordered_tables(self, tables: Iterable[str]) -> frozenset[str]:
        """Those of ``tables`` with a unique or exclusion constraint checked
        before commit (absent tables are not in the result)."""
        ...


class ConstraintOrder:
    """Rewrites a batch's rows steps for the tables whose constraints need it."""

    def __init__(self, writer: object) -> None:
        self._writer: OrderedTables | None = (
            writer if callable(getattr(writer, "ordered_tables", None)) else None  # type: ignore[assignment]
        )
        self._known: dict[str, bool] = {}

    def forget(self) -> None:
        self._known.clear()

    def steps(self, steps: Sequence[Step]) -> Sequence[Step]:
        """``steps``, with the rows steps of constrained tables split in two."""
        if self._writer is None:
            return steps
        names = {s.schema.table for s in steps if isinstance(s, RowsStep)}
        unknown = names.difference(self._known)
        if unknown:
            found = self._writer.ordered_tables(sorted(unknown))
            self._known.update((t, t in found) for t in unknown)
        ordered = {t for t in names if self._known[t]} | _gaining_unique(steps)
        if any(isinstance(s, SchemaStep | SqlStep | CallStep) for s in steps):
            self.forget()  # the batch may create or drop constraints: read them again
        if not ordered:
            return steps
        out: list[Step] = []
        for step in steps:
            if isinstance(step, RowsStep) and step.schema.table in ordered:
                out.extend(_delete_then_insert(step))
            else:
                out.append(step)
        return out


def _gaining_unique(steps: Sequence[Step]) -> set[str]:
    """Tables a schema step of the batch may give a unique constraint (the catalog
    read above is from before the batch): ordered from the start, which is safe."""
    return {
        s.schema.table
        for s in steps
        if isinstance(s, SchemaStep)
        and any(
            c.kind in (pb.CONSTRAINT_KIND_UNIQUE, pb.CONSTRAINT_KIND_EXCLUDE) or c.unique
            for c in s.schema.constraints
        )
    }


def _delete_then_insert(step: RowsStep) -> list[Step]:
    """The step as: its deletes; then delete the upserted keys and insert them."""
    out: list[Step] = []
    none = step.upserts.slice(0, 0)
    if step.deletes.num_rows:
        out.append(RowsStep(step.schema, step.deletes, none))
    if step.upserts.num_rows:
        # A writer deletes by the key columns of ``deletes``: the upserts' rows do.
        out.append(RowsStep(step.schema, step.upserts, step.upserts, fresh=step.upserts.num_rows))
    return out
