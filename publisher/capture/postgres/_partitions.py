"""Partitioned tables, published by their parent (root).

A partitioned table holds no rows itself; its partitions (leaves) do, and PostgreSQL
decodes every change on the leaf it touched.  Three things make the parent publishable
as one table:

* The PostgreSQL publication says ``publish_via_partition_root = true`` (created so,
  or altered at start when it predates this): pgoutput then sends every leaf's change
  under the parent's relation (its name, its columns in its order).  An UPDATE that
  moves a row to another partition is decoded as a DELETE from the old leaf and an
  INSERT into the new one, both as the parent: a key change like any other (the
  partition key is part of the primary key, as PostgreSQL requires).  pgoutput reads
  the option from the catalog as of each decoded change, so changes decoded before
  the ALTER are sent by leaf: only a partitioned table added at that same start could
  have any, and its capture starts after the ALTER (install comes after set-up).
* ``ALTER PUBLICATION ... ADD TABLE ONLY parent`` still covers the partitions, present
  and future: PostgreSQL counts a partition as published through its ancestors, and
  ``ONLY`` only keeps classic inheritance children out (tested: the rows of every
  partition arrive).
* Full row images come from the leaf's replica identity, not the parent's: every
  partition gets ``REPLICA IDENTITY FULL`` at install, and again at every start.
  A partition created or attached while capture runs has its own (default) identity
  until then: its updates carry only the key as the old image, which capture still
  applies (the new row is whole), except an update that leaves a TOASTed value
  unchanged: the value is in neither image.  Such a change is not logged; instead
  (:func:`set_full`, from the session) the lacking partitions are given FULL and the
  table's copy is requested as for a schema change (``_evolve.py``): the copy, taken
  at a consistent point after that transaction, carries the value.  Between the change
  and the copy's entries the target lacks that one update (the compromise the copies
  of schema changes make too); rejected: failing capture for good (the previous
  behaviour: an operator had to set FULL in the transaction that made the partition),
  and reading the value from the source's current row (it may have changed since, and
  a later change would then be applied over a newer value).
* Snapshots read the parent *with* its partitions: ``FROM ONLY`` is kept for plain
  tables (rows of classic inheritance children are not published: their changes are
  not captured), dropped for a partitioned one (ONLY would read nothing).

wal2json names the leaf in each change and has no via-root option: a partitioned
table is refused at install under it, saying to use pgoutput.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

__all__ = [
    "leaves_identity",
    "publication_members",
    "relkind",
    "select_from",
    "set_full",
    "via_root",
]

Conn = psycopg.Connection[tuple[Any, ...]]


def via_root(conn: Conn, publication: str) -> None:
    """Make ``publication`` publish partitions' changes as their root table."""
    row = conn.execute(
        "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (publication,)
    ).fetchone()
    if row is not None and not row[0]:
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(
                sql.Identifier(publication)
            )
        )


def relkind(conn: Conn, table_sql: str) -> str:
    """``r`` (table), ``p`` (partitioned table), ... of a table by its SQL name."""
    row = conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (table_sql,))
    found = row.fetchone()
    return str(found[0]) if found else ""


def select_from(conn: Conn, table_sql: str) -> str:
    """``FROM`` of a snapshot read: ``ONLY t`` for a plain table, ``t`` for a partitioned one."""
    return table_sql if relkind(conn, table_sql) == "p" else f"ONLY {table_sql}"


def leaves_identity(conn: Conn, table_sql: str) -> tuple[str, list[str]]:
    """The replica identity to act on, and the SQL names of the partitions lacking FULL
    (none for a plain table): ``f`` only if the table and every partition have FULL."""
    rows = conn.execute(
        "SELECT format('%%I.%%I', n.nspname, c.relname), c.relreplident"
        " FROM pg_partition_tree(to_regclass(%s)) t JOIN pg_class c ON c.oid = t.relid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.level > 0",
        (table_sql,),
    ).fetchall()
    lacking = [str(name) for name, ident in rows if ident != "f"]
    own = conn.execute(
        "SELECT relreplident FROM pg_class WHERE oid = to_regclass(%s)", (table_sql,)
    ).fetchone()
    ident = str(own[0]) if own else ""
    return ("f" if ident == "f" and not lacking else ident or "d"), lacking


def publication_members(conn: Conn, publication: str) -> list[tuple[str, str]]:
    """(schema, table) of the tables added to ``publication`` (roots, not partitions)."""
    return [
        (str(s), str(t))
        for s, t in conn.execute(
            "SELECT n.nspname, c.relname FROM pg_publication_rel pr"
            " JOIN pg_publication p ON p.oid = pr.prpubid JOIN pg_class c ON c.oid = pr.prrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
            (publication,),
        ).fetchall()
    ]


def set_full(conn: Conn, table_sql: str, lock_timeout_s: float) -> list[str]:
    """Give FULL replica identity to the partitions of ``table_sql`` lacking it, waiting
    at most ``lock_timeout_s`` for each; the SQL names of those that could not be."""
    left: list[str] = []
    for rel in leaves_identity(conn, table_sql)[1]:
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout_s * 1000)}ms'")
                conn.execute(f"ALTER TABLE {rel} REPLICA IDENTITY FULL")
        except psycopg.Error:
            left.append(rel)
    return left
