"""Small batches written from plain rows steps (subscriber/apply/_plain.py) leave the
target rows the Arrow rows steps leave, in a real SQLite file and a real PostgreSQL
database: seeded in-sync batches of every type at its extremes, same-key chains,
key changes, deletes and re-inserts."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, _few
from subscriber.apply.lazy import LazySpark
from subscriber.apply.writer import Writer
from subscriber.targets.postgres import PostgresWriter
from subscriber.targets.sqlite import SqliteWriter
from tests.support.entries import INC
from tests.unit.subscriber import plain_batches

SCHEMAS = plain_batches.schemas()


def _no_spark() -> Any:
    raise AssertionError("a small batch of plain tables needs no Spark")


def _run(
    writer: Writer, seed: int, arrow: bool, monkeypatch: pytest.MonkeyPatch, rows: Callable[[], Any]
) -> list[Any]:
    """Apply the seed's batches; after each, the target's rows (``rows()``) and level."""
    with monkeypatch.context() as m:
        if arrow:  # every few events' step built in Arrow, as before _plain.py
            m.setattr(_few, "decoded", lambda buf: None)
        spark = LazySpark(_no_spark, at_once=False, start_after_s=1e9)
        applier = Applier(spark, writer, subscription="s")  # type: ignore[arg-type]
        schema_ops = [pb.Op(schema=s) for s in SCHEMAS.values()]
        level = applier.apply(1, [pb.Entry(ops=schema_ops)], incarnation=INC).level
        rng = random.Random(seed)
        seen = []
        for _ in range(30):
            batch = plain_batches.batch(rng, SCHEMAS)
            level = applier.apply(level + 1, batch, incarnation=INC).level
            seen.append((level, rows()))
        return seen


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sqlite_rows_from_plain_steps_equal_those_from_arrow_steps(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every batch leaves the same rows (each cell's stored type and bytes) and level."""
    got = []
    for arrow in (True, False):
        path = tmp_path / f"{arrow}.db"
        writer = SqliteWriter(str(path))

        def rows(path: Path = path) -> list[Any]:
            with sqlite3.connect(path) as conn:
                return [
                    conn.execute(f'SELECT quote("{c.name}") FROM {t} ORDER BY rowid').fetchall()
                    for t, s in SCHEMAS.items()
                    for c in s.columns
                ]

        got.append(_run(writer, seed, arrow, monkeypatch, rows))
        writer.close()
    assert got[0] == got[1]
    assert any(any(cells) for _, tables in got[1] for cells in tables), "no rows to compare"


@pytest.mark.postgres
@pytest.mark.parametrize("seed", [1, 2])
def test_postgres_rows_from_plain_steps_equal_those_from_arrow_steps(
    pg_db: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every batch leaves the same rows (each row's text form) and level."""
    got = []
    for arrow in (True, False):
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for t in [*SCHEMAS, "txrepl_subscriptions"]:
                conn.execute(f"DROP TABLE IF EXISTS {t}".encode())
        writer = PostgresWriter(pg_db)

        def rows() -> list[Any]:
            with psycopg.connect(pg_db) as conn:
                return [
                    conn.execute(f"SELECT x::text FROM {t} x ORDER BY 1".encode()).fetchall()
                    for t in SCHEMAS
                ]

        got.append(_run(writer, seed, arrow, monkeypatch, rows))
        writer.close()
    assert got[0] == got[1]
    assert any(any(tables) for _, tables in got[1]), "no rows to compare"
