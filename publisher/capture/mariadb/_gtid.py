"""GTIDs as capture positions, and snapshots pinned at a GTID.

A MariaDB GTID is ``domain-server-seq``.  Within one replication domain ``seq`` grows
with every transaction written to the binary log, in binary-log (= commit) order,
whichever server wrote it (``gtid_strict_mode`` makes the server refuse anything
else).  Capture follows one domain, so a transaction's position is the integer
``seq << 32 | server``: ordered by ``seq``, and carrying the server id that
``@slave_connect_state`` needs to resume after it (``domain-server-seq`` again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pymysql

from common.dburl import DatabaseUrl
from common.names import quote_ident
from common.rpc import txrepl_pb2 as pb
from publisher.capture.mariadb._catalog import Conn, connect, read_shape
from publisher.capture.values import rows_chunk
from publisher.errors import SourceError

__all__ = ["Pinned", "domain_of", "gtid_of", "parse_gtids", "pinned", "position", "seq_of"]

_SERVER_BITS = 32


def position(server: int, seq: int) -> int:
    """The capture position of GTID ``*-server-seq`` (module docstring)."""
    return seq << _SERVER_BITS | server


def seq_of(pos: int) -> int:
    return pos >> _SERVER_BITS


def gtid_of(domain: int, pos: int) -> str:
    """``domain-server-seq`` of position ``pos`` ("" for 0: the binary log's start)."""
    if pos == 0:
        return ""
    return f"{domain}-{pos & (1 << _SERVER_BITS) - 1}-{seq_of(pos)}"


def parse_gtids(text: str) -> dict[int, tuple[int, int]]:
    """``@@gtid_binlog_pos`` text -> {domain: (server, seq)}."""
    out: dict[int, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            d, s, n = (int(x) for x in part.split("-"))
        except ValueError:
            raise SourceError(f"MariaDB GTID {part!r} is not domain-server-seq") from None
        out[d] = (s, n)
    return out


def domain_of(text: str, default: int) -> int:
    """The one domain of a GTID position; SourceError when it names several."""
    domains = sorted(parse_gtids(text))
    if len(domains) > 1:
        raise SourceError(
            f"the MariaDB source's binary log holds GTID domains {domains}; txrepl follows"
            " one domain (a source written by one primary): see docs/mariadb.md"
        )
    return domains[0] if domains else default


def at_domain(text: str, domain: int) -> int:
    """The capture position of ``domain``'s GTID in position text (0: none yet)."""
    server, seq = parse_gtids(text).get(domain, (0, 0))
    return position(server, seq)


@dataclass
class Pinned:
    """A transaction holding a consistent snapshot, and the GTID position it is as of."""

    conn: Conn
    gtid: str
    pos: int

    def chunks(self, table: str, chunk_rows: int) -> Iterator[pb.SnapshotChunk]:
        """``table``'s rows as of the snapshot, ``chunk_rows`` at a time (read unbuffered)."""
        shape = read_shape(self.conn, table)
        cur = self.conn.cursor(pymysql.cursors.SSCursor)
        try:
            cur.execute(f"SELECT {shape.select_list(quote_ident)} FROM {quote_ident(table)}")
            chunk = rows_chunk(shape.schema.table)
            convert = shape.convert
            for r in cur.fetchall_unbuffered():
                chunk.rows.rows.add().values.extend(f(v) for f, v in zip(convert, r, strict=True))
                if len(chunk.rows.rows) >= chunk_rows:
                    yield chunk
                    chunk = rows_chunk(shape.schema.table)
            if chunk.rows.rows:
                yield chunk
        finally:
            cur.close()

    def count(self, table: str) -> int:
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {quote_ident(table)}")
            row = cur.fetchone()
        return int(row[0]) if row else 0


@contextlib.contextmanager
def pinned(url: DatabaseUrl, domain: int) -> Iterator[Pinned]:
    """Start a consistent snapshot and read the GTID position it is as of.

    ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` makes MariaDB report the binary log
    offset the snapshot matches (``binlog_snapshot_file`` / ``_position``: every
    transaction before it visible, none after, for InnoDB), and ``BINLOG_GTID_POS``
    turns that offset into the GTID position there, without locking anything.
    """
    conn = connect(url, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
            cur.execute(
                "SELECT BINLOG_GTID_POS(%s, %s)",
                (status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])),
            )
            row = cur.fetchone()
        gtid = str(row[0] or "") if row else ""
        pos = at_domain(gtid, domain)
        if pos:
            gtid = gtid_of(domain, pos)
        yield Pinned(conn, gtid, pos)
    finally:
        with contextlib.suppress(pymysql.MySQLError):
            conn.rollback()
        conn.close()
