"""The source as a node: its name recorded in it, the origin of its own changes.

``common/origin.py`` has the rules; this is the publisher's half of R1: at start the
daemon checks the configured node against the recorded one before it opens the
source (a mismatch changes nothing), and records (or reads back) the source's node
name in ``txrepl_node`` once the source passed its checks, in one short
transaction of its own, before any capture is installed.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from common.dburl import DatabaseUrl
from common.origin import NodeMismatchError, claim_node
from publisher.errors import SourceError

__all__ = ["claim_source_node"]


def claim_source_node(
    url: DatabaseUrl, configured: str, default: str, *, record: bool = True
) -> str:
    """The source's node name, recorded in it if it had none (SourceError, changing
    nothing, if ``configured`` disagrees with the recorded one).  ``record=False``:
    only check, writing nothing (the daemon checks before it opens the source, and
    records once the source passed its own checks)."""
    try:
        return _claim(url, configured, default, record)
    except NodeMismatchError as exc:
        raise SourceError(f"source {url.raw.rsplit('@', 1)[-1]}: {exc}") from None


def _claim(url: DatabaseUrl, configured: str, default: str, record: bool) -> str:
    if url.dialect == "sqlite":
        if not url.sqlite_path.exists():
            raise SourceError(f"SQLite source {url.sqlite_path} does not exist")
        conn = sqlite3.connect(url.sqlite_path, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                name = claim_node(conn, "sqlite", configured, default, record=record)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return name
        except sqlite3.Error as exc:
            what = f"the node (txrepl_node) of {url.sqlite_path}"
            raise SourceError(f"cannot read or record {what}: {exc}") from exc
        finally:
            conn.close()
    if url.dialect == "mariadb":
        return _claim_mariadb(url, configured, default, record)
    import psycopg  # deferred: only for a PostgreSQL source

    try:
        with psycopg.connect(url.raw, connect_timeout=10) as pg, pg.transaction():
            pg.execute("SELECT pg_advisory_xact_lock(hashtext('txrepl node'))")
            return claim_node(pg, "postgresql", configured, default, record=record)
    except psycopg.Error as exc:
        where = url.raw.rsplit("@", 1)[-1]
        what = f"the node (txrepl_node) of PostgreSQL source {where}"
        raise SourceError(f"cannot read or record {what}: {exc}") from exc


class _Statements:
    """``execute(sql).fetchone()`` over a PyMySQL connection, as claim_node reads it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str) -> Any:
        cur = self.conn.cursor()
        cur.execute(sql)
        return cur


def _claim_mariadb(url: DatabaseUrl, configured: str, default: str, record: bool) -> str:
    import pymysql  # deferred: only for a MariaDB source

    from publisher.capture.mariadb._catalog import connect

    conn = connect(url, autocommit=False)
    try:
        stmts = _Statements(conn)
        stmts.execute("SELECT GET_LOCK('txrepl node', 30)")
        try:
            name = claim_node(stmts, "mariadb", configured, default, record=record)
            conn.commit()
        finally:
            stmts.execute("SELECT RELEASE_LOCK('txrepl node')")
        return name
    except pymysql.MySQLError as exc:
        where = url.raw.rsplit("@", 1)[-1]
        what = f"the node (txrepl_node) of MariaDB source {where}"
        raise SourceError(f"cannot read or record {what}: {exc}") from exc
    finally:
        conn.close()
