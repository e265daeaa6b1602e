"""PostgreSQL ``republish``: the resolver's rows written after the batch, with no origin.

Why a transaction of their own
==============================
A PostgreSQL writer sets the replication origin of the entries it applies on its
session (``subscriber/targets/postgres/_origin.py``), and logical decoding tags a
*whole transaction* with it: a row written as a local change inside the batch's
transaction would be logged by this node's capture under the batch's origin, and
R3 (``common/origin.py``) would then keep it from the very node it must reach, the
originator.  So a republished row is written in a second transaction, after the
batch commits, with no origin set: the capture gives it this node's own origin and
it goes to everyone, the originator included.

The two transactions and a crash between them
==============================================
1. The batch's transaction (:meth:`ConflictGuard.finish`) leaves the key's row as
   it was (the target's), records the key's version from it as for any key, and
   adds one row to ``txrepl_republish`` (``_sql.REPUBLISH_DDL``: the key, the
   resolver's row or NULL for a delete, the table's columns, and ``expect``, the
   key's version as the batch left it).

   It commits with the rows, the conflict log and the level (atomically).
2. Right after the commit, and before the writer's next batch whenever one is
   still there (a crash or a lost connection between 1 and 2, or a failed 2),
   :func:`drain` writes each row in one transaction with no origin and outside the
   replica role (the target's triggers fire, as for a local change), records the
   key's new version, and deletes the ``txrepl_republish`` row, all at once.

A row is written only if the key still holds the row the batch left (its version
equals ``expect``): the only writes that can come between 1 and 2 are the
application's own, and such a write is itself a local change, captured and sent to
everyone, that supersedes the resolver's row here anyway; the republish is then
dropped (a warning names the key).  So a crash loses no republish, and none is
written twice (the delete of its row commits with it).

Values go through JSON (``jsonb_populate_record`` casts them back to the column
types), so a republish left by a crash needs nothing but the table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import structlog

from common.names import quote_ident
from subscriber.targets.conflicts._sql import ConflictSql, pg_json

__all__ = ["drain", "record"]

log = structlog.get_logger("txrepl.subscriber.conflicts")

Row = dict[str, Any]


def record(
    sql: ConflictSql,
    cur: Any,
    subscription: str,
    table: str,
    columns: Sequence[str],
    rows: Sequence[tuple[Row, str, Row | None, str]],
) -> None:
    """Step 1: the republished rows ``(key, its version key, row or None, expected
    version)`` of one rows step, in the batch's transaction."""
    sql.run_many(
        cur,
        "INSERT INTO txrepl_republish (subscription, table_name, row_key, version_key, "
        '"row", columns, expect) VALUES (%s, %s, %s::jsonb, %s, %s::jsonb, %s::jsonb, %s) '
        "RETURNING id",
        [
            (
                subscription,
                table,
                pg_json(key),
                key_text,
                None if row is None else pg_json(row),
                json.dumps(list(columns)),
                expect,
            )
            for key, key_text, row, expect in rows
        ],
    )


def drain(sql: ConflictSql, cur: Any, version_of: Any) -> int:
    """Step 2, in a transaction with no origin: write every recorded republish;
    the number written.  ``version_of(row or None)``: a key's version text."""
    got = sql.run(
        cur,
        "SELECT to_regclass('txrepl_republish') IS NOT NULL",
        (),
    )
    if not got[0][0]:
        return 0
    pending = sql.run(
        cur,
        'SELECT id, subscription, table_name, row_key, version_key, "row", columns, expect '
        "FROM txrepl_republish ORDER BY id",
        (),
    )
    written = 0
    for rid, subscription, table, key, key_text, row, columns, expect in pending:
        t = sql.table(table)
        names = list(columns)
        where = (
            f"({', '.join(quote_ident(k) for k in key)}) = (SELECT "
            f"{', '.join(quote_ident(k) for k in key)} FROM jsonb_populate_record(NULL::{t}, "
            "%s::jsonb))"
        )
        key_json = json.dumps(key)
        select = f"SELECT {', '.join(quote_ident(n) for n in names)} FROM {t} WHERE {where}"
        now = sql.run(cur, select, (key_json,))
        if version_of(dict(zip(names, now[0], strict=True)) if now else None) != expect:
            log.warning(
                "republish dropped: the row changed here since the conflict",
                subscription=subscription,
                table=table,
                key=key_json,
            )
        else:
            for stmt in sql.local_begin:
                sql.run(cur, stmt, ())
            if row is None:
                sql.run(cur, f"DELETE FROM {t} WHERE {where}", (key_json,))
            else:
                cols = [quote_ident(n) for n in names if n in row]
                rest = [quote_ident(n) for n in names if n in row and n not in key]
                sets = ", ".join(f"{c} = excluded.{c}" for c in rest)
                sql.run(
                    cur,
                    f"INSERT INTO {t} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM "
                    f"jsonb_populate_record(NULL::{t}, %s::jsonb) ON CONFLICT "
                    f"({', '.join(quote_ident(k) for k in key)}) "
                    + (f"DO UPDATE SET {sets}" if rest else "DO NOTHING"),
                    (json.dumps(row),),
                )
            for stmt in sql.local_end:
                sql.run(cur, stmt, ())
            now = sql.run(cur, select, (key_json,))
            version = version_of(dict(zip(names, now[0], strict=True)) if now else None)
            sql.run(
                cur,
                "INSERT INTO txrepl_row_versions (subscription, table_name, row_key, row_hash) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (subscription, table_name, row_key) "
                "DO UPDATE SET row_hash = excluded.row_hash",
                (subscription, table, key_text, version),
            )
            written += 1
        sql.run(cur, "DELETE FROM txrepl_republish WHERE id = %s", (rid,))
    return written
