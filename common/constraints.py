"""A table's secondary constraints and indexes on the wire (``TableSchema.constraints``).

Both sources put a table's UNIQUE, CHECK and FOREIGN KEY constraints and its other
indexes into every schema op they log; both targets create them with the table and,
on a later schema op, drop those of the previous schema that are gone and add those
that are new, **by name** (a constraint whose definition changed under the same name
is dropped and added again).

Ordering: when the constraint is applied relative to the rows around it
=====================================================================
A schema op is a barrier in its batch (the batch is split around it), applied in
the same target transaction as the rows before and after it, so a kill -9 of the
subscriber leaves either all of it or none (invariant 3).  Its position ``P`` in the
log is:

* PostgreSQL source: just before the table's first row change decoded after the DDL
  committed at ``D`` (pgoutput sends a relation message before that change, never at
  the DDL itself);
* SQLite source: the refresh of the first poll that sees ``schema_version`` moved,
  one ``BEGIN IMMEDIATE`` transaction, so ``P`` is a point of the capture order
  after ``D``; the rows captured between ``D`` and ``P`` are logged before it.

Adding constraint ``K`` on table ``t`` at ``P`` refuses nothing the source accepted:
the source validated ``K`` on ``t`` at ``D`` and enforced it on every later commit,
so the source state at every point after ``D``, in particular just before ``P``,
satisfies ``K``; the target at ``P`` holds exactly that state (invariant 3 applied
to the log prefix).  UNIQUE, CHECK and indexes read only ``t``; for a foreign key
from ``t`` to ``p`` the parent side is in the same state too (the source refused,
after ``D``, any change of ``p`` that orphaned a row of ``t``; an ``ON DELETE``
action is a change of ``t`` and so comes after ``P``, or is ``P``'s row).  Rows
after ``P`` were all committed after ``D``: they satisfy ``K``.

Dropping ``K`` at ``P``: a row the target would still refuse is a row committed
after ``D`` and logged before ``P``.  On a PostgreSQL source the rows of ``t`` in
that span do not exist (``P`` is the first); a parent's rows that orphan children
are applied with ``session_replication_role = replica``, under which foreign keys
are not checked; a SQLite target's writer runs with ``foreign_keys = OFF``, and
its CHECKs come from a SQLite source, where changing one takes a rebuild of the
table, which drops the capture triggers with the old table: no row is captured
between ``D`` and ``P`` (the refresh at ``P`` logs the schema, a truncate and a
copy of the rows, ``publisher/capture/sqlite/shapes.py``).  The one gap left is a
SQLite source: a UNIQUE index dropped there
and violated before the next poll (milliseconds) is refused at the target, which
stops naming the constraint; dropping it on the target by hand and `txrepl
subscriber errors retry` resumes.

The catalog read is the current one (PostgreSQL, ``_pgcatalog``): a constraint added
after ``P`` but before the change at ``P`` is decoded is applied early, at ``P``,
and rows between ``P`` and its ``D`` that the source accepted before it existed
could be refused.  The window is the decoding lag; the same holds today for the
primary key and NOT NULL.

A new constraint that the target's rows violate (the target was changed by hand, or
holds rows the source never had) stops the subscription with the table and the
constraint named, and the entry holding the schema op is parked in
``txrepl_errors`` as any refused entry.

This module holds what both sides share: the comparison and the publication rule
("table constraints are also replicated, except foreign keys to tables outside the
publication", :func:`for_publication`).
"""

from __future__ import annotations

from collections.abc import Collection

from common.rpc import txrepl_pb2 as pb

__all__ = ["changed", "for_publication", "same_shape"]


def for_publication(schema: pb.TableSchema, tables: Collection[str]) -> pb.TableSchema:
    """``schema`` without its foreign keys to tables that are not in ``tables``
    (a publication's table names, as entries write them)."""
    keep = [
        c
        for c in schema.constraints
        if c.kind != pb.CONSTRAINT_KIND_FOREIGN_KEY or c.ref_table in tables
    ]
    if len(keep) == len(schema.constraints):
        return schema
    out = pb.TableSchema()
    out.CopyFrom(schema)
    del out.constraints[:]
    out.constraints.extend(keep)
    return out


def same_shape(a: pb.TableSchema, b: pb.TableSchema) -> bool:
    """Whether ``a`` and ``b`` differ at most in their constraints (rows of one decode
    as rows of the other: no copy of the table is needed)."""
    return (
        a.table == b.table
        and list(a.columns) == list(b.columns)
        and list(a.primary_key) == list(b.primary_key)
    )


def changed(
    previous: pb.TableSchema | None, schema: pb.TableSchema
) -> tuple[list[pb.TableConstraint], list[pb.TableConstraint]]:
    """(constraints of ``previous`` to drop, constraints of ``schema`` to add), by name.

    ``previous`` None: the table is new to the target, every constraint is added.
    """
    before = {c.name: c for c in previous.constraints} if previous is not None else {}
    after = {c.name: c for c in schema.constraints}
    drop = [c for n, c in before.items() if after.get(n) != c]
    add = [c for n, c in after.items() if before.get(n) != c]
    return drop, add
