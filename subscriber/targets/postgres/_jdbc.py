"""Large batches into PostgreSQL: Spark writes the staging tables over JDBC.

When a rows step holds at least ``[apply] jdbc_min_rows`` row changes (0, the
default: never), its deletes (key columns) and upserts (all columns) reach the
target through Spark's JDBC writer, from the executors and in parallel, into
UNLOGGED staging tables ``txrepl_jdbc_<token>_<step>_<d|u>``, *before* the batch's
transaction.  That transaction (``writer.py``) then merges from them exactly as
from its COPY stages (``DELETE ... USING``, ``INSERT ... ON CONFLICT``), empties
them (TRUNCATE) and moves the level, and commits.

Atomicity: the staging tables are scratch space.  Nothing in them is target data
until the merge, which runs in the one transaction that also checks and moves the
level.  A crash or an error at any point before that commit leaves the target as it
was; the next attempt drops and re-creates the tables before Spark fills them, so
rows of an attempt that died never mix with the next one's.

Isolation: ``token`` is random per writer, so two writers (even of the same
subscription, one of which the level lock will refuse) never share a staging table.
Each writer holds a session advisory lock on its token; the first time it stages on
a connection it drops staging tables whose token's lock is free (their writer is
gone), so a crash leaves no tables behind for long.

Values travel as PostgreSQL input text, the forms COPY reads (``_copy.py``), with
``stringtype=unspecified``: the server casts each to the staging column's type.
The JDBC URL, user and password come from the target URL; the target must be
reachable over TCP from the executors (a Unix-socket host is refused), and Spark
needs PostgreSQL's JDBC driver (``[spark] jars = ["/usr/share/java/postgresql.jar"]``,
Debian's ``libpostgresql-jdbc-java``; Maven is not reachable).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import TransientError, WriterError
from subscriber.apply.session import arrow_frame
from subscriber.targets.postgres._copy import pg_column

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["JdbcStager", "jdbc_target"]

PREFIX = "txrepl_jdbc_"
_DRIVER = "org.postgresql.Driver"
_DRIVER_HINT = (
    "Spark cannot load PostgreSQL's JDBC driver (org.postgresql.Driver), which "
    "[apply] jdbc_min_rows needs: add its jar to [spark] jars, e.g. "
    'jars = ["/usr/share/java/postgresql.jar"] (Debian package libpostgresql-jdbc-java)'
)


def jdbc_target(dsn: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties of a libpq target URL."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise ValueError(f"target URL cannot be parsed: {e}") from e
    host = str(params.get("host") or "localhost")
    if host.startswith("/") or "," in host:
        raise ValueError(
            f"[apply] jdbc_min_rows needs the target as one TCP host (got host {host!r}): "
            "Spark's executors connect to it over JDBC"
        )
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or params.get("user") or "postgres")
    url = f"jdbc:postgresql://{'[' + host + ']' if ':' in host else host}:{port}/{dbname}"
    props = {"driver": _DRIVER, "stringtype": "unspecified", "reWriteBatchedInserts": "true"}
    for key in ("user", "password", "sslmode"):
        if params.get(key):
            props[key] = str(params[key])
    props["ApplicationName"] = "txrepl-subscriber-jdbc"
    return url, props


def text_table(table: pa.Table, schema: pb.TableSchema, indexes: list[int]) -> pa.Table:
    """Columns ``indexes`` of an apply table as PostgreSQL input text, named ``c<i>``."""
    arrays = []
    for i in indexes:
        col = pg_column(table, i, schema.columns[i])
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            col = pc.cast(col, pa.string())
        arrays.append(col)
    return pa.table(arrays, names=[f"c{i}" for i in indexes])


class JdbcStager:
    """Writes the big rows steps of a batch into staging tables through Spark JDBC."""

    def __init__(self, spark: SparkSession, dsn: str, min_rows: int, role: str | None) -> None:
        self.spark = spark
        self.min_rows = min_rows
        self.role = role
        self.url, self.props = jdbc_target(dsn)
        self.token = secrets.token_hex(6)
        self._locked_on: Any = None  # the connection holding our token's lock
        self._check_driver()

    def _check_driver(self) -> None:
        jvm: Any = self.spark._jvm
        try:
            loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
            jvm.java.lang.Class.forName(_DRIVER, False, loader)
        except Exception as e:
            raise ValueError(_DRIVER_HINT) from e

    def wanted(self, rows: int) -> bool:
        return rows >= self.min_rows

    def name(self, step: int, kind: str) -> str:
        return f"{PREFIX}{self.token}_{step}_{kind}"

    def prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Once per connection: hold our token's lock; drop dead writers' tables."""
        if self._locked_on is conn:
            return
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (PREFIX + self.token,))
        self._locked_on = conn
        rows = self._tables(conn)
        tokens = {str(r)[len(PREFIX) :].split("_", 1)[0] for r in rows} - {self.token}
        for token in sorted(tokens):
            (free,) = conn.execute(  # type: ignore[misc]
                "SELECT pg_try_advisory_lock(hashtext(%s))", (PREFIX + token,)
            ).fetchone()
            if not free:
                continue  # its writer is alive
            try:
                self._drop(conn, [r for r in rows if r.startswith(f"{PREFIX}{token}_")])
            finally:
                conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (PREFIX + token,))

    def drop_all(self, conn: psycopg.Connection[Any]) -> None:
        """Drop this writer's staging tables (when it closes)."""
        self._drop(conn, [r for r in self._tables(conn) if r.startswith(PREFIX + self.token)])

    @staticmethod
    def _drop(conn: psycopg.Connection[Any], tables: list[str]) -> None:
        for rel in tables:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(rel)))

    @staticmethod
    def _tables(conn: psycopg.Connection[Any]) -> list[str]:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE %s"
            " AND c.relnamespace = current_schema()::regnamespace",
            (PREFIX.replace("_", "\\_") + "%",),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def stage(
        self,
        conn: psycopg.Connection[Any],
        name: str,
        table: pa.Table,
        schema: pb.TableSchema,
        indexes: list[int],
        types: list[str],
    ) -> None:
        """(Re)create staging table ``name`` and fill it from ``table`` through Spark;
        ``types``: the staging type of each column of ``schema`` (the writer's)."""
        cols = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(f"c{i}"), sql.SQL(types[i])) for i in indexes
        )
        with conn.transaction():
            if self.role:
                conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(self.role)))
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
            conn.execute(
                sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(sql.Identifier(name), cols)
            )
        df = arrow_frame(self.spark, text_table(table, schema, indexes))
        parallel = max(1, int(self.spark.sparkContext.defaultParallelism))
        if df.rdd.getNumPartitions() < parallel and table.num_rows >= 2 * parallel:
            df = df.repartition(parallel)
        try:
            df.write.option("numPartitions", parallel).jdbc(
                self.url, name, mode="append", properties=self.props
            )
        except Exception as e:
            text = str(e)
            first = next((ln for ln in text.splitlines() if ln.strip()), text)[:500]
            if _DRIVER in text and ("ClassNotFound" in text or "No suitable driver" in text):
                raise WriterError(_DRIVER_HINT) from e
            if "SQLState: 08" in text or "Connection refused" in text or "connection" in first:
                raise TransientError(f"Spark JDBC staging into {name} failed: {first}") from e
            raise WriterError(f"Spark JDBC staging into {name} failed: {first}") from e
