"""The source database's catalog and txrepl's own table in it.

``txrepl_installs`` (created in the source database on first install) holds one row
per publication and table: the log incarnation it was installed for, and the GTID of
the snapshot that logged its existing rows (NULL: not logged yet).  Its own changes
reach the binary log like any other table's; capture ignores every table no
publication holds, this one included.

Connections: PyMySQL, autocommit, ``time_zone = '+00:00'`` (TIMESTAMP values read as
UTC, as the binary log holds them), ``ANSI_QUOTES`` (``common.names.quote_ident``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import pymysql

from common.dburl import DatabaseUrl, mariadb_params
from common.names import format_table, unqualified
from publisher.capture.mariadb._types import ColumnInfo, TableShape, refusal
from publisher.errors import SourceError

__all__ = [
    "INSTALLS",
    "Conn",
    "check_server",
    "connect",
    "gtid_position",
    "mariadb_table",
    "read_shape",
]

if TYPE_CHECKING:
    Conn: TypeAlias = pymysql.connections.Connection[Any]
else:
    Conn = pymysql.connections.Connection

INSTALLS = "txrepl_installs"
_CREATE = f"""CREATE TABLE IF NOT EXISTS {INSTALLS} (
  publication VARCHAR(255) NOT NULL,
  tbl VARCHAR(64) NOT NULL,
  incarnation VARCHAR(64) NOT NULL,
  snapshot_gtid VARCHAR(255) NULL,
  PRIMARY KEY (publication, tbl)
) ENGINE=InnoDB"""
_SESSION = "SET SESSION time_zone = '+00:00', sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES')"


def connect(url: DatabaseUrl, *, autocommit: bool = True) -> Conn:
    """A connection to the source database (module docstring); SourceError if it fails."""
    try:
        params = mariadb_params(url, role="source")
    except ValueError as e:
        raise SourceError(str(e)) from None
    try:
        return pymysql.connect(
            **params, charset="utf8mb4", autocommit=autocommit, init_command=_SESSION
        )
    except pymysql.MySQLError as e:
        raise SourceError(f"MariaDB source {_where(params)}: {e.args[-1]}") from e


def check_server(conn: Conn, url: DatabaseUrl) -> int:
    """Refuse, in one line, a server whose binary log capture cannot read; its GTID domain.

    MariaDB only (MySQL's GTIDs are another format), with a row-based binary log of full
    images and column names (package docstring).
    """
    where = url.raw.rsplit("@", 1)[-1]
    with conn.cursor() as cur:
        cur.execute("SELECT @@version, @@log_bin, @@binlog_format, @@binlog_row_image")
        row = cur.fetchone()
        assert row is not None
        version, log_bin, fmt, image = (str(v) for v in row)
        if "mariadb" not in version.lower():
            raise SourceError(
                f"source {where}: server {version} is not MariaDB; txrepl reads MariaDB's"
                " binary log and GTIDs (MySQL's are not supported as a source yet)"
            )
        cur.execute("SELECT @@binlog_row_metadata, @@gtid_domain_id")
        meta_row = cur.fetchone()
        assert meta_row is not None
        meta, domain = str(meta_row[0]), int(meta_row[1])
    settings = {
        "log_bin": (log_bin, "1"),
        "binlog_format": (fmt.upper(), "ROW"),
        "binlog_row_image": (image.upper(), "FULL"),
        "binlog_row_metadata": (meta.upper(), "FULL"),
    }
    wrong = [f"{k}={have}" for k, (have, want) in settings.items() if have != want]
    if wrong:
        raise SourceError(
            f"MariaDB source {where}: capture reads a row-based binary log with full row"
            f" images and column names; the server has {', '.join(wrong)}: set log_bin,"
            " binlog_format=ROW, binlog_row_image=FULL and binlog_row_metadata=FULL"
            " (docs/mariadb.md) and restart it"
        )
    return domain


def _where(params: dict[str, Any]) -> str:
    at = params.get("unix_socket") or f"{params['host']}:{params['port']}"
    return f"{params['database']} at {at}"


def mariadb_table(spec: str) -> str:
    """The MariaDB table a configured name (common/names.py) means: one flat name."""
    try:
        return unqualified(spec, "a MariaDB source publishes tables of the database its URL names")
    except ValueError as e:
        raise SourceError(str(e)) from None


def gtid_position(conn: Conn) -> str:
    """``@@gtid_binlog_pos``: the GTID of the last transaction in the binary log, per domain."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        row = cur.fetchone()
    return str(row[0] or "") if row else ""


def read_shape(conn: Conn, table: str, *, check: bool = False) -> TableShape:
    """``table``'s shape as the catalog has it now; SourceError naming what is wrong.

    ``check``: also refuse what capture cannot carry (install): no such table, no
    primary key, an engine without transactions, a column type without a mapping.
    """
    with conn.cursor() as cur:
        cur.execute(
            "SELECT ENGINE FROM information_schema.tables"
            " WHERE table_schema = DATABASE() AND table_name = %s",
            (table,),
        )
        row = cur.fetchone()
        if row is None:
            raise SourceError(f"table {table!r} does not exist in the MariaDB source")
        if check and str(row[0] or "").lower() != "innodb":
            raise SourceError(
                f"table {table!r} uses the {row[0]} engine; txrepl captures InnoDB tables only"
                " (their commits and the binary log agree, and a snapshot is consistent):"
                f" ALTER TABLE {table} ENGINE=InnoDB"
            )
        cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE,"
            " NUMERIC_PRECISION, NUMERIC_SCALE FROM information_schema.columns"
            " WHERE table_schema = DATABASE() AND table_name = %s ORDER BY ORDINAL_POSITION",
            (table,),
        )
        infos = [
            ColumnInfo(
                name=str(r[0]),
                data_type=str(r[1]).lower(),
                column_type=str(r[2]),
                nullable=r[3] == "YES",
                precision=int(r[4] or 0),
                scale=int(r[5] or 0),
            )
            for r in cur.fetchall()
        ]
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.statistics WHERE table_schema ="
            " DATABASE() AND table_name = %s AND index_name = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
            (table,),
        )
        key = [str(r[0]) for r in cur.fetchall()]
    if not key:
        raise SourceError(
            f"table {table!r} in the MariaDB source has no PRIMARY KEY; txrepl needs one to"
            " identify rows: ALTER TABLE ... ADD PRIMARY KEY (...)"
        )
    wire = format_table(None, table)
    if check:
        for c in infos:
            why = refusal(table, c)
            if why is not None:
                raise SourceError(why)
    try:
        return TableShape.of(wire, infos, key)
    except ValueError as e:
        raise SourceError(str(e)) from None


def installs(conn: Conn) -> dict[tuple[str, str], tuple[str, str | None]]:
    """(publication, table) -> (incarnation, snapshot GTID or None)."""
    with conn.cursor() as cur:
        cur.execute(_CREATE)
        cur.execute(f"SELECT publication, tbl, incarnation, snapshot_gtid FROM {INSTALLS}")
        return {(str(p), str(t)): (str(i), g) for p, t, i, g in cur.fetchall()}


def record_install(
    conn: Conn, publication: str, incarnation: str, keep: Sequence[str], add: Sequence[str]
) -> None:
    """``publication`` holds ``keep`` + ``add`` for ``incarnation``; ``add`` wait for rows."""
    tables = [*keep, *add]
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        marks = ", ".join(["%s"] * len(tables))
        cur.execute(
            f"DELETE FROM {INSTALLS} WHERE publication = %s"
            + (f" AND (tbl NOT IN ({marks}) OR incarnation <> %s)" if tables else ""),
            (publication, *tables, incarnation) if tables else (publication,),
        )
        for t in add:
            cur.execute(
                f"INSERT INTO {INSTALLS} VALUES (%s, %s, %s, NULL)"
                " ON DUPLICATE KEY UPDATE incarnation = VALUES(incarnation), snapshot_gtid = NULL",
                (publication, t, incarnation),
            )
        cur.execute("COMMIT")


def record_snapshot(conn: Conn, publication: str, tables: Sequence[str], gtid: str) -> None:
    """The rows of ``tables`` are in ``publication``'s log, as of ``gtid``."""
    with conn.cursor() as cur:
        cur.executemany(
            f"UPDATE {INSTALLS} SET snapshot_gtid = %s WHERE publication = %s AND tbl = %s",
            [(gtid, publication, t) for t in tables],
        )
