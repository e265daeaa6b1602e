"""The writer contract's backends: SQLite, a private PostgreSQL and a private MariaDB,
one fixture."""

from __future__ import annotations

import datetime as dt
import decimal
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from subscriber.apply import (
    Writer,
)
from subscriber.targets.mariadb import MariaWriter
from subscriber.targets.mariadb._conn import connect as maria_connect
from subscriber.targets.postgres import PostgresWriter
from subscriber.targets.sqlite import SqliteWriter


def norm(v: object) -> object:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, memoryview):
        return bytes(v)
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    return v


@dataclass
class Backend:
    """One empty target database of some dialect."""

    name: str
    make: Callable[[], Writer]
    _query: Callable[[str], list[tuple[Any, ...]]]
    execute: Callable[[str], None]

    def query(self, text: str) -> list[tuple[Any, ...]]:
        return [tuple(norm(v) for v in r) for r in self._query(text)]

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        return self.query(f'SELECT * FROM "{table}" ORDER BY 1')


def _sqlite_backend(path: Path) -> Backend:
    def query(text: str) -> list[tuple[Any, ...]]:
        with sqlite3.connect(path) as conn:
            return conn.execute(text).fetchall()

    def execute(text: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.executescript(text)

    return Backend("sqlite", lambda: SqliteWriter(path), query, execute)


def _postgres_backend(dsn: str) -> Backend:
    import psycopg

    def query(text: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn) as conn:
            return conn.execute(text.encode()).fetchall()

    def execute(text: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(text.encode())

    return Backend("postgresql", lambda: PostgresWriter(dsn), query, execute)


def _maria_backend(url: str) -> Backend:
    """Read and written with the apply session's settings (ANSI_QUOTES: the suite's
    double-quoted names read as on the other targets)."""

    def query(text: str) -> list[tuple[Any, ...]]:
        conn = maria_connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute(text)
                return list(cur.fetchall())
        finally:
            conn.close()

    def execute(text: str) -> None:
        conn = maria_connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute(text)
            conn.commit()
        finally:
            conn.close()

    return Backend("mariadb", lambda: MariaWriter(url), query, execute)


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


def make_backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh target of dialect ``kind`` (its server from the session's fixtures)."""
    if kind == "sqlite":
        return _sqlite_backend(tmp_path / "target.db")
    if kind == "postgresql":
        return _postgres_backend(request.getfixturevalue("pg_db"))
    return _maria_backend(request.getfixturevalue("maria_db"))
