"""Query snapshots (Virtuoso's ``CREATE NONINCREMENTAL SNAPSHOT dest AS 'query'``).

A publication's ``[[publication.snapshot]]`` names a target ``table``, a ``query``
(a SELECT over the source, in the source's SQL), the ``key`` of its result and a
refresh period ``every_s``.  Each refresh evaluates the query in one read transaction
of the source and appends, as **one group of entries** (common/fragments.py: applied
atomically by every subscriber, never split), the table's schema, a TRUNCATE and every
row of the result.  A subscriber's target table is thus replaced by the new result in
one target transaction, and a subscriber that was away gets the latest result with
everything else it missed, in log order.  Subscribers need nothing new.

Ordering: the group is appended while the publication's other appends wait
(:meth:`Publication.exclusive`), so no captured change interleaves with it (capture
waits while the result is read; it loses nothing).  The result is a point in time of
the source, as Virtuoso's non-incremental snapshots are, not aligned with a seq.  Memory: the
result is read in chunks and appended as fragments of at most ``max_entry_bytes``;
nothing holds the whole result.

Types: a PostgreSQL source gives each result column's type (mapped like captured
columns, ``COLUMN_TYPE_TEXT`` for the rest); a SQLite source has none, so a column
is typed by its first non-NULL value in the first 1000 rows (integer, real, text,
blob; TEXT if none).

At start (:func:`check_queries`) each query is prepared (``LIMIT 0``) on the source:
a query that fails, or a ``key`` not among its columns, is one line and nothing is
written.  A refresh that fails later (the source down, a dropped table) is logged and
retried at the next period; the target keeps the previous result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import itertools
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import structlog

from common.names import parse_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from common.values import encode
from publisher.capture.groups import GroupWriter
from publisher.config import PublisherConfig, QuerySnapshotConfig
from publisher.errors import ShapeRefused
from publisher.publication import Publication

__all__ = ["QuerySnapshots", "check_queries", "refresh"]

log = structlog.get_logger(__name__)

_CHUNK = 1000
_PG_TYPES = {  # result column type OIDs (pg_type) -> wire type
    16: pb.COLUMN_TYPE_BOOLEAN,
    20: pb.COLUMN_TYPE_INTEGER,
    21: pb.COLUMN_TYPE_INTEGER,
    23: pb.COLUMN_TYPE_INTEGER,
    700: pb.COLUMN_TYPE_FLOAT,
    701: pb.COLUMN_TYPE_FLOAT,
    1700: pb.COLUMN_TYPE_DECIMAL,
    25: pb.COLUMN_TYPE_TEXT,
    1043: pb.COLUMN_TYPE_TEXT,
    17: pb.COLUMN_TYPE_BYTES,
    1082: pb.COLUMN_TYPE_DATE,
    1083: pb.COLUMN_TYPE_TIME,
    1114: pb.COLUMN_TYPE_TIMESTAMP,
    1184: pb.COLUMN_TYPE_TIMESTAMPTZ,
    3802: pb.COLUMN_TYPE_JSON,
}
_PY_TYPES: list[tuple[type, int]] = [
    (bool, pb.COLUMN_TYPE_BOOLEAN),
    (int, pb.COLUMN_TYPE_INTEGER),
    (float, pb.COLUMN_TYPE_FLOAT),
    (decimal.Decimal, pb.COLUMN_TYPE_DECIMAL),
    (str, pb.COLUMN_TYPE_TEXT),
    (bytes, pb.COLUMN_TYPE_BYTES),
    (dt.datetime, pb.COLUMN_TYPE_TIMESTAMP),
    (dt.date, pb.COLUMN_TYPE_DATE),
]


def _py_type(v: object) -> int:
    return next((t for cls, t in _PY_TYPES if isinstance(v, cls)), pb.COLUMN_TYPE_TEXT)


class _Result:
    """The query's columns, their types (None: not known yet) and its rows, in chunks."""

    def __init__(self, names: list[str], types: list[int | None], chunks: Iterator[list[Any]]):
        self.names = names
        self.types = types
        self.chunks = chunks


def _read(cfg: PublisherConfig, sql: str, *, limit0: bool = False) -> Iterator[_Result]:
    """Yield the result of ``sql`` once, read inside one read transaction."""
    url = cfg.source_url
    query = f"SELECT * FROM ({sql}) AS q LIMIT 0" if limit0 else sql
    if url.is_sqlite:
        conn = sqlite3.connect(url.sqlite_path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            conn.execute("BEGIN")
            cur = conn.execute(query)
            names = [d[0] for d in cur.description]
            yield _Result(names, [None] * len(names), iter(lambda: cur.fetchmany(_CHUNK), []))
        finally:
            conn.close()
        return
    if url.dialect == "mariadb":
        raise ShapeRefused(
            'query snapshots are not available on a MariaDB source yet (docs/mariadb.md, "Limits")'
        )
    import psycopg  # deferred: only a PostgreSQL source needs it

    with psycopg.connect(url.raw, connect_timeout=10) as pg:
        pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        with pg.cursor(name="txrepl_query_snapshot") as pcur:
            pcur.execute(query)
            first = pcur.fetchmany(_CHUNK)
            desc = pcur.description or []
            names = [d.name for d in desc]
            types: list[int | None] = [
                _PG_TYPES.get(d.type_code, pb.COLUMN_TYPE_TEXT) for d in desc
            ]

            def chunks() -> Iterator[list[Any]]:
                rows = first
                while rows:
                    yield rows
                    rows = pcur.fetchmany(_CHUNK)

            yield _Result(names, types, chunks())


def _problem(q: QuerySnapshotConfig, names: Sequence[str]) -> str:
    missing = [k for k in q.key if k not in names]
    return f"key {missing} is not among the query's columns {list(names)}" if missing else ""


def check_queries(cfg: PublisherConfig) -> None:
    """Prepare every query snapshot's query on the source; ShapeRefused (one line)."""
    for pc in cfg.publication:
        for q in pc.snapshot:
            try:
                for result in _read(cfg, q.query, limit0=True):
                    problem = _problem(q, result.names)
                    if problem:
                        raise ShapeRefused(problem)
            except ShapeRefused as e:
                raise ShapeRefused(f"publication {pc.name!r}, snapshot {q.table!r}: {e}") from None
            except Exception as e:  # the source's own words: sqlite3, psycopg
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ShapeRefused(
                    f"publication {pc.name!r}, snapshot {q.table!r}: the query fails: {first}"
                ) from None


def refresh(cfg: PublisherConfig, pub: Publication, q: QuerySnapshotConfig) -> int:
    """Evaluate ``q`` and replace its table on every subscriber; returns the rows sent."""
    table = str(parse_table(q.table))
    rows = 0
    for result in _read(cfg, q.query):
        problem = _problem(q, result.names)
        if problem:
            raise ShapeRefused(problem)
        first = next(result.chunks, [])
        chunks = itertools.chain([first], result.chunks)
        if None in result.types:  # SQLite: typed by the first non-NULL value of a chunk
            for i in range(len(result.types)):
                seen = next((r[i] for r in first if r[i] is not None), None)
                result.types[i] = _py_type(seen) if seen is not None else pb.COLUMN_TYPE_TEXT
        types = [t or pb.COLUMN_TYPE_TEXT for t in result.types]
        schema = pb.TableSchema(table=table, primary_key=list(q.key))
        for name, t in zip(result.names, types, strict=True):
            schema.columns.add(name=name, type=t, nullable=name not in q.key)
        with pub.exclusive():
            group = GroupWriter(pub)
            try:
                rows += _append_result(group, pub, schema, types, chunks, cfg.max_entry_bytes)
            except BaseException:
                group.abort()  # close what was appended as abandoned (P3): nobody applies it
                raise
    return rows


def _append_result(
    group: GroupWriter,
    pub: Publication,
    schema: pb.TableSchema,
    types: Sequence[int],
    chunks: Iterator[list[Any]],
    max_bytes: int,
) -> int:
    """Schema, TRUNCATE and the rows as fragments of at most ``max_bytes``; the rows sent."""
    table = schema.table
    rows = 0
    entry = pb.Entry(ops=[pb.Op(schema=schema)])
    entry.ops.add().row.CopyFrom(pb.RowChange(table=table, op=pb.ROW_OP_TRUNCATE))
    size = entry.ByteSize()
    for chunk in chunks:
        for r in chunk:
            rc = pb.RowChange(table=table, op=pb.ROW_OP_INSERT)
            rc.row.extend(encode(v, t) for v, t in zip(r, types, strict=True))
            op = pb.Op(row=rc)
            n = op.ByteSize() + 6
            if size + n > max_bytes and entry.ops:
                group.add(entry, pub.position)
                entry, size = pb.Entry(), 0
            entry.ops.append(op)
            size += n
            rows += 1
    group.add(entry, pub.position)
    group.finish(pub.position)
    return rows


class QuerySnapshots:
    """The daemon's query snapshots: refreshed by period (:meth:`loop`) or on demand
    (:meth:`refresh_now`, ``txrepl admin refresh-snapshot``), dropped (:meth:`drop`,
    ``txrepl admin drop-snapshot [--with-delete]``).  One refresh of a table at a time."""

    def __init__(
        self,
        cfg: PublisherConfig,
        pubs: Mapping[str, Publication],
        keys: Mapping[str, Sequence[str]] = {},
    ) -> None:
        """``keys``: the primary key of each table of a snapshot-only publication."""
        self.cfg = cfg
        self.pubs = pubs
        self.jobs = {
            (pc.name, str(parse_table(q.table))): q for pc in cfg.publication for q in pc.snapshot
        }
        for pc in cfg.publication:
            if pc.snapshot_only:
                for t in pc.tables:
                    ref = parse_table(t)
                    parts = [ref.name] if ref.schema is None else [ref.schema, ref.name]
                    if cfg.source_url.is_sqlite:
                        parts = [ref.flat]
                    query = "SELECT * FROM " + ".".join(quote_ident(x) for x in parts)
                    name = str(ref)
                    job = QuerySnapshotConfig(name, query, list(keys.get(name, ())) or ["?"])
                    self.jobs[(pc.name, name)] = dataclasses.replace(
                        job, every_s=pc.refresh_every_s
                    )
        self.dropped: set[tuple[str, str]] = set()
        self._locks = {k: threading.Lock() for k in self.jobs}

    def find(self, publication: str, table: str) -> QuerySnapshotConfig:
        """The snapshot, or LookupError saying which exist."""
        try:
            key = (publication, str(parse_table(table)))
        except ValueError as e:
            raise LookupError(str(e)) from None
        if key not in self.jobs or key in self.dropped:
            known = sorted(f"{p}.{t}" for p, t in self.jobs if (p, t) not in self.dropped)
            raise LookupError(
                f"no query snapshot {table!r} in publication {publication!r} (known: {known})"
            )
        return self.jobs[key]

    def refresh_now(self, publication: str, table: str) -> int:
        q = self.find(publication, table)
        with self._locks[(publication, str(parse_table(q.table)))]:
            rows = refresh(self.cfg, self.pubs[publication], q)
        log.info("query snapshot refreshed", publication=publication, table=q.table, rows=rows)
        return rows

    def drop(self, publication: str, table: str, *, with_delete: bool) -> None:
        """No more refreshes; ``with_delete``: the table is dropped on every subscriber."""
        q = self.find(publication, table)
        key = (publication, str(parse_table(q.table)))
        with self._locks[key]:
            self.dropped.add(key)
            if with_delete:
                # executed as it is by every target (an SqlStatement op, docs/apply.md)
                ref = parse_table(q.table)
                parts = [ref.name] if ref.schema is None else [ref.schema, ref.name]
                sql = "DROP TABLE IF EXISTS " + ".".join(quote_ident(x) for x in parts)
                self.pubs[publication].append(pb.Entry(ops=[pb.Op(sql=pb.SqlStatement(sql=sql))]))
        log.info(
            "query snapshot dropped",
            publication=publication,
            table=q.table,
            with_delete=with_delete,
        )

    async def loop(self) -> None:
        """Refresh every snapshot at start and then every ``every_s`` (0: at start only)."""
        if not self.jobs:
            return
        clock = asyncio.get_running_loop()
        due: dict[tuple[str, str], float] = {}
        while True:
            now = clock.time()
            for key, q in self.jobs.items():
                if key in self.dropped or due.get(key, now) > now:
                    continue
                try:
                    await asyncio.to_thread(self.refresh_now, *key)
                except LookupError:
                    continue  # dropped meanwhile
                except Exception as e:  # logged, retried at the next period
                    log.error(
                        "query snapshot failed", publication=key[0], table=q.table, error=str(e)
                    )
                due[key] = now + q.every_s if q.every_s > 0 else float("inf")
            await asyncio.sleep(0.2)
