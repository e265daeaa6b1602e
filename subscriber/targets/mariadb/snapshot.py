"""Load a publisher snapshot into a MariaDB target: shadow tables, one DML transaction.

Driven by :func:`subscriber.reinit.client.load_into` through the loader protocol
(:class:`subscriber.reinit.client.ShadowLoader`).

Atomicity argument (MariaDB commits every DDL statement on its own, so the swap
cannot rename tables inside the transaction that moves the level, as SQLite does):

1. The snapshot is the content of every published table as of one seq S.
2. It is loaded into shadow tables ``txrepl_s_<hash>`` (short: a table name is at
   most 64 characters), in chunks.  Readers see the old tables; a kill leaves them
   intact (the next run drops and rebuilds the shadows).
3. DDL that only adds: a table missing on the target is created (empty), a column
   missing is added.  A kill here leaves an empty new table or a NULL column beside
   the old rows and the old level: the next run finds them there.
4. ONE transaction: per table ``DELETE FROM t`` and ``INSERT INTO t SELECT ... FROM
   shadow``, the subscription's recorded schemas replaced, the level set to S with
   the snapshot's incarnation.  Readers see the old state or the new one; the rows
   and the level move together.  The target tables keep their own definitions
   (indexes, constraints, triggers: the apply session's ``@txrepl_applying`` is set
   for those), as the other targets' reinit does.
5. After the commit: the shadows are dropped, and the columns the published schema no
   longer has are dropped (a kill before leaves them, NULL-able, in place).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import pymysql

from common.names import parse_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from common.values import decode
from subscriber.reinit.errors import SnapshotError
from subscriber.targets.mariadb._conn import Executor, connect
from subscriber.targets.mariadb._types import (
    check_schema,
    column_sql,
    python_value,
    quote_table,
)
from subscriber.targets.mariadb.writer import METADATA_SQL, MariaWriter, create_table_sql

__all__ = ["MariaSnapshotLoader", "shadow_name"]

FLUSH_ROWS = 20_000


def shadow_name(table: str) -> str:
    """The shadow table of wire table ``table`` (unquoted)."""
    return "txrepl_s_" + hashlib.sha1(table.encode()).hexdigest()[:20]


class MariaSnapshotLoader:
    """Shadow tables in the MariaDB database, swapped in by one DML transaction."""

    def __init__(self, url: str, subscription: str) -> None:
        MariaWriter(url).close()  # creates the metadata tables if missing
        self.flush_rows = FLUSH_ROWS
        self.log_fields: Mapping[str, str] = {}
        self.single_start = False
        self.prefetch = False
        self.copy_text = False  # rows only: PostgreSQL COPY text is not MariaDB's
        self.subscription = subscription
        self.schemas: dict[str, pb.TableSchema] = {}
        try:
            self.conn = connect(url)
        except pymysql.err.MySQLError as exc:
            raise SnapshotError(f"cannot open MariaDB target: {exc}") from exc

    def _exec(self, sql: str, args: Any = None) -> pymysql.cursors.Cursor:
        cur: pymysql.cursors.Cursor = self.conn.cursor()
        cur.execute(sql, args)
        return cur

    def begin(self, start: pb.SnapshotStart) -> None:
        for t in start.tables:
            try:
                check_schema(t.schema)
            except Exception as exc:
                raise SnapshotError(str(exc)) from exc
            self.schemas[t.schema.table] = t.schema
            shadow = quote_ident(shadow_name(t.schema.table))
            self._exec(f"DROP TABLE IF EXISTS {shadow}")
            self._exec(create_table_sql(t.schema, shadow))

    def buffer(self, table: str, buf: list[Any], rows: Any) -> None:
        where = f"table {table!r}"
        buf.extend(
            tuple(None if (x := decode(v)) is None else python_value(x, where) for v in r.values)
            for r in rows
        )

    def write(self, table: str, rows: list[Any]) -> int:
        n = len(self.schemas[table].columns)
        shadow = quote_ident(shadow_name(table))
        with self.conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {shadow} VALUES ({', '.join('%s' for _ in range(n))})", rows
            )
        self.conn.commit()
        return len(rows)

    def _columns(self, table: str) -> list[str]:
        rows = self._exec(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE()"
            " AND table_name = %s ORDER BY ordinal_position",
            (parse_table(table).flat,),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def write_copy(self, table: str, text: bytes) -> None:
        raise SnapshotError(f"COPY text for table {table!r}: a MariaDB target takes rows")

    def swap(self, start: pb.SnapshotStart, recorded: Mapping[str, pb.TableSchema]) -> None:
        try:
            self._swap(start, recorded)
        except pymysql.err.MySQLError as exc:
            self.conn.rollback()
            raise SnapshotError(f"cannot swap the snapshot into the MariaDB target: {exc}") from exc
        finally:
            for table in self.schemas:
                self._exec(f"DROP TABLE IF EXISTS {quote_ident(shadow_name(table))}")

    def _swap(self, start: pb.SnapshotStart, recorded: Mapping[str, pb.TableSchema]) -> None:
        extra: dict[str, list[str]] = {}
        for table, schema in self.schemas.items():  # 3: DDL that only adds
            have = self._columns(table)
            if not have:
                self._exec(create_table_sql(schema))
                continue
            lower = {c.lower() for c in have}
            for c in schema.columns:
                if c.name.lower() not in lower:
                    self._exec(
                        f"ALTER TABLE {quote_table(table)} ADD COLUMN"
                        f" {quote_ident(c.name)} {column_sql(c, key=False)}"
                    )
            now = {c.name.lower() for c in schema.columns}
            extra[table] = [c for c in have if c.lower() not in now]
        self.conn.begin()  # 4: one transaction
        for table, schema in self.schemas.items():
            names = ", ".join(quote_ident(c.name) for c in schema.columns)
            self._exec(f"DELETE FROM {quote_table(table)}")
            self._exec(
                f"INSERT INTO {quote_table(table)} ({names}) SELECT {names}"
                f" FROM {quote_ident(shadow_name(table))}"
            )
        with self.conn.cursor() as cur:
            ex = Executor(cur)
            METADATA_SQL.replace_schemas(ex, self.subscription, recorded)
            METADATA_SQL.set_level(ex, self.subscription, start.incarnation, start.seq)
        self.conn.commit()
        for table, gone in extra.items():  # 5: what the published schema dropped
            for name in gone:
                self._exec(f"ALTER TABLE {quote_table(table)} DROP COLUMN {quote_ident(name)}")

    def close(self) -> None:
        self.conn.close()
