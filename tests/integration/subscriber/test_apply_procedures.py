"""Procedure calls replayed in order: a Python handler (any target), CALL on PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from common import values
from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier
from subscriber.targets.postgres import PostgresWriter
from subscriber.targets.sqlite import SqliteWriter
from tests.support.entries import INC, ITEMS, entry, ins, schema_op

pytestmark = pytest.mark.spark


def call(name: str, *args: object) -> pb.Op:
    return pb.Op(call=pb.ProcedureCall(name=name, args=[values.encode(a) for a in args]))


def test_python_handler_runs_in_order_in_the_batch(spark: Any, tmp_path: Path) -> None:
    """A registered handler sees the rows before it and runs in the batch transaction."""
    seen: list[tuple[int, str]] = []

    def rename_all(conn: Any, suffix: str) -> None:
        seen.append((conn.execute("SELECT count(*) FROM items").fetchone()[0], suffix))
        conn.execute("UPDATE items SET name = name || ?", (suffix,))

    writer = SqliteWriter(tmp_path / "t.db", procedures={"shop.rename_all": rename_all})
    applier = Applier(spark, writer, "sub")
    applier.apply(
        1,
        [entry(schema_op(ITEMS), ins("items", 1, "a", None), call("shop.rename_all", "!"))],
        incarnation=INC,
    )
    applier.apply(2, [entry(ins("items", 2, "b", None))], incarnation=INC)
    assert seen == [(1, "!")]
    rows = writer._conn.execute("SELECT id, name FROM items ORDER BY id").fetchall()
    assert rows == [(1, "a!"), (2, "b")]


@pytest.mark.postgres
def test_postgres_call_same_named_procedure(spark: Any, pg_db: str) -> None:
    """Without a handler, PostgreSQL runs CALL name(args) between the rows around it."""
    writer = PostgresWriter(pg_db)
    applier = Applier(spark, writer, "sub")
    applier.apply(1, [entry(schema_op(ITEMS), ins("items", 1, "a", None))], incarnation=INC)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "CREATE PROCEDURE bump(k bigint, label text) LANGUAGE sql"
            " AS $$ UPDATE items SET name = name || label WHERE id = k $$"
        )
    applier.apply(
        2,
        [entry(call("bump", 1, "+"), ins("items", 2, "b", None), call("bump", 2, "-"))],
        incarnation=INC,
    )
    with psycopg.connect(pg_db) as conn:
        assert conn.execute("SELECT id, name FROM items ORDER BY id").fetchall() == [
            (1, "a+"),
            (2, "b-"),
        ]
    writer.close()
