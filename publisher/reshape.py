"""Shaping at start: the configured filters checked, and a changed filter carried out.

**The check** (:func:`check_shapes`), before anything is opened or written: every
column a publication's ``columns`` or ``filter`` names must be in the source table,
the key must be among the published columns, and the filter must compile; else one
:class:`~publisher.errors.ShapeRefused` line stops the publisher.

**A changed filter or column list** (xDB: rows that leave a changed filter are
deleted on the subscribers).  The shaping in force is recorded per publication in
``<data_dir>/shapes/<publication>.json`` once carried out.  At start, a table whose
configured shaping differs from the recorded one (or a publication that existed,
head > 0, with no record: it was published whole) is re-shaped once capture runs:

1. ``Source.snapshot`` pins seq S: the rows are the source as of S.
2. The publication's appends are held (:meth:`Publication.exclusive`), head H.  The
   entries S+1..H are read: a key they touch was carried after S by the new shaping
   already (the shaper has applied it since this process started) and is left alone;
   a TRUNCATE or a schema op of the table there retakes the whole change.
3. For every other row of S: inside the old shaping and outside the new filter →
   DELETE of its key; inside the new filter and (outside the old one, or the columns
   changed) → INSERT of the row (an upsert on the target).  These ops, after the
   table's schema, are appended at H+1... through the shaper (so they are projected
   like any other), still holding the appends: no change can come between.
4. The record is written (tmp, fsync, rename).  A crash before it repeats 1-3, which
   is harmless (deletes and upserts of the same rows).

Why it is exact: a key untouched in S+1..H has at H the value it had at S, so its
delete or insert is the source's state through the new shaping; a key touched there
had its last change shaped by the new filter already.  Later changes follow as usual.
The held appends last as long as the table's read (the capture waits, loses nothing).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from common.names import parse_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from publisher.capture.source import Source
from publisher.config import PublicationConfig, PublisherConfig
from publisher.errors import ShapeRefused
from publisher.publication import Publication
from publisher.shaping import TableShaping, shapings

__all__ = [
    "check_shapes",
    "pending_reshapes",
    "reshape_pending",
    "source_columns",
    "start_reshapes",
]

log = structlog.get_logger(__name__)

_OPS_PER_ENTRY = 1000


def source_columns(cfg: PublisherConfig, table: str) -> tuple[list[str], list[str]] | None:
    """(columns, key) of a source table; None if the table is missing (install says so)."""
    ref = parse_table(table)
    url = cfg.source_url
    if url.is_sqlite:
        if not url.sqlite_path.is_file():
            return None
        conn = sqlite3.connect(url.sqlite_path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            rows = conn.execute(f"PRAGMA table_xinfo({quote_ident(ref.flat)})").fetchall()
        finally:
            conn.close()
        cols = [r[1] for r in rows if r[6] in (0, 2, 3)]  # not hidden virtual columns
        key = [r[1] for r in sorted(rows, key=lambda r: r[5]) if r[5]]
        return (cols, key) if rows else None
    if url.dialect == "mariadb":
        raise ShapeRefused(
            f"table {table!r}: row filters, column lists and snapshot-only publications"
            ' are not available on a MariaDB source yet (docs/mariadb.md, "Limits")'
        )
    import psycopg  # deferred: only a PostgreSQL source needs it

    qualified = f"{quote_ident(ref.schema or 'public')}.{quote_ident(ref.name)}"
    try:
        with psycopg.connect(url.raw, connect_timeout=10) as pg:
            cols = [
                r[0]
                for r in pg.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                    "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                    (qualified,),
                )
            ]
            key = [
                r[0]
                for r in pg.execute(
                    "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
                    "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                    "WHERE i.indrelid = to_regclass(%s) AND i.indisprimary",
                    (qualified,),
                )
            ]
    except psycopg.Error:
        return None  # the source's own open says what is wrong, in its words
    return (cols, key) if cols else None


def check_shapes(cfg: PublisherConfig) -> None:
    """Refuse a filter or column list the source's tables cannot take (module docstring)."""
    for pc in cfg.publication:
        for table, shaping in shapings(pc.filter, pc.columns).items():
            found = source_columns(cfg, table)
            if found is None:
                continue
            try:
                shaping.check(*found)
            except ShapeRefused as e:
                raise ShapeRefused(f"publication {pc.name!r}: {e}") from None


def snapshot_only_keys(cfg: PublisherConfig) -> dict[str, list[str]]:
    """The primary key of every table of a snapshot-only publication (querysnap.py);
    a missing table or one without a key is refused in one line (SourceError)."""
    keys: dict[str, list[str]] = {}
    for pc in cfg.publication:
        if not pc.snapshot_only:
            continue
        for t in pc.tables:
            found = source_columns(cfg, t)
            if found is None or not found[1]:
                what = "is not in the source" if found is None else "has no primary key"
                raise ShapeRefused(f"publication {pc.name!r} (snapshot_only): table {t!r} {what}")
            keys[str(parse_table(t))] = found[1]
    return keys


# -- the record of the shaping in force ---------------------------------------------


def _record_path(data_dir: Path, publication: str) -> Path:
    return data_dir / "shapes" / f"{publication}.json"


def _as_record(pc: PublicationConfig) -> dict[str, Any]:
    return {
        t: {"filter": s.filter, "columns": list(s.columns) if s.columns else None}
        for t, s in shapings(pc.filter, pc.columns).items()
    }


def _write_record(data_dir: Path, pub: Publication) -> None:
    path = _record_path(data_dir, pub.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    text = json.dumps({"incarnation": pub.log.incarnation, "tables": _as_record(pub.config)})
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def reshape_pending(
    data_dir: Path, pub: Publication
) -> dict[str, tuple[TableShaping, TableShaping]]:
    """Tables whose shaping changed: table -> (old, new).  A fresh log records at once."""
    path = _record_path(data_dir, pub.name)
    new = _as_record(pub.config)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        record = None
    if record is None or record.get("incarnation") != pub.log.incarnation:
        if pub.log.head == 0 or record is not None:
            # A new log (or a re-created one) is installed whole through the shaper.
            if new or record is not None:
                _write_record(data_dir, pub)
            return {}
        old: dict[str, Any] = {}
    else:
        old = record.get("tables", {})
    out: dict[str, tuple[TableShaping, TableShaping]] = {}
    for table in sorted({*old, *new}):
        if old.get(table) == new.get(table):
            continue
        o, n = old.get(table) or {}, new.get(table) or {}
        out[table] = (_shaping(table, o), _shaping(table, n))
    return out


def _shaping(table: str, rec: dict[str, Any]) -> TableShaping:
    cols = rec.get("columns")
    return TableShaping(table, rec.get("filter") or "", tuple(cols) if cols else None)


# -- carrying a change out ------------------------------------------------------------


class _Retake(Exception):
    """The table was truncated or altered after S: take the change again."""


def _key(values: Iterator[pb.Value]) -> tuple[bytes, ...]:
    return tuple(v.SerializeToString(deterministic=True) for v in values)


def _touched(
    pub: Publication, table: str, after: int, head: int, key: list[int]
) -> set[tuple[bytes, ...]]:
    """Keys of ``table`` changed in seqs after..head; _Retake on its TRUNCATE or schema."""
    keys: set[tuple[bytes, ...]] = set()
    seq = after + 1
    while seq <= head:
        payloads = pub.log.read(seq, max_entries=min(1000, head - seq + 1))
        for payload in payloads:
            for op in pb.Entry.FromString(payload).ops:
                kind = op.WhichOneof("kind")
                if kind == "schema" and op.schema.table == table:
                    raise _Retake(f"table {table!r} changed schema")
                if kind != "row" or op.row.table != table:
                    continue
                rc = op.row
                if rc.op == pb.ROW_OP_TRUNCATE:
                    raise _Retake(f"table {table!r} was truncated")
                if rc.key:
                    keys.add(_key(iter(rc.key)))
                elif rc.op == pb.ROW_OP_INSERT:
                    keys.add(_key(rc.row[i] for i in key))
        seq += len(payloads)
    return keys


def _reshape_table(
    source: Source, pub: Publication, table: str, old: TableShaping, new: TableShaping
) -> tuple[int, int]:
    """Steps 1-3 of the module docstring for one table; (deleted, inserted)."""
    with source.snapshot(pub, timeout_s=60.0) as snap:
        schema = next((s for s, _ in snap.tables if s.table == table), None)
        if schema is None:
            return 0, 0
        names = [c.name for c in schema.columns]
        key_idx = [names.index(k) for k in schema.primary_key]
        old_filter = old.check(names, list(schema.primary_key))
        new_filter = new.check(names, list(schema.primary_key))
        resend_all = old.columns != new.columns
        deleted = inserted = 0
        with pub.exclusive() as head:
            # a new shaping's projected key sits at the same positions in its own schema
            proj_key = [
                [n for n in names if new.columns is None or n in new.columns].index(k)
                for k in schema.primary_key
            ]
            touched = _touched(pub, table, snap.seq, head, proj_key)
            entry = pb.Entry(ops=[pb.Op(schema=schema)])
            for chunk in snap.chunks(schema, 5000):
                for row in chunk.rows.rows:
                    vals = row.values
                    key = _key(vals[i] for i in key_idx)
                    if key in touched:
                        continue
                    was = old_filter is None or old_filter(vals)
                    now = new_filter is None or new_filter(vals)
                    if was and not now:
                        rc = pb.RowChange(table=table, op=pb.ROW_OP_DELETE)
                        rc.key.extend(vals[i] for i in key_idx)
                        deleted += 1
                    elif now and (resend_all or not was):
                        rc = pb.RowChange(table=table, op=pb.ROW_OP_INSERT, row=vals)
                        inserted += 1
                    else:
                        continue
                    entry.ops.append(pb.Op(row=rc))
                    if len(entry.ops) >= _OPS_PER_ENTRY:
                        pub.append(entry)
                        entry = pb.Entry()
            if entry.ops:
                pub.append(entry)
    return deleted, inserted


def _run(
    source: Source,
    pub: Publication,
    data_dir: Path,
    changes: dict[str, tuple[TableShaping, TableShaping]],
) -> None:
    for table, (old, new) in changes.items():
        for attempt in range(5):
            try:
                deleted, inserted = _reshape_table(source, pub, table, old, new)
            except _Retake as e:
                log.info("shaping change retaken", publication=pub.name, why=str(e))
                continue
            except Exception as e:  # logged, the record not written: retried at next start
                log.error(
                    "shaping change failed; it is retried at the next start",
                    publication=pub.name,
                    table=table,
                    error=str(e),
                )
                return
            log.info(
                "shaping changed",
                publication=pub.name,
                table=table,
                filter=new.filter,
                columns=list(new.columns) if new.columns else None,
                deleted=deleted,
                inserted=inserted,
                attempt=attempt + 1,
            )
            break
        else:
            log.error("shaping change gave up after 5 attempts", publication=pub.name, table=table)
            return
    _write_record(data_dir, pub)


def pending_reshapes(
    pubs: list[Publication], data_dir: Path
) -> dict[str, dict[str, tuple[TableShaping, TableShaping]]]:
    """:func:`reshape_pending` of every publication, by name: read before capture starts
    (a log's head 0 says it is new, and capture's first entry would change that)."""
    return {pub.name: reshape_pending(data_dir, pub) for pub in pubs}


def start_reshapes(
    source: Source,
    pubs: list[Publication],
    data_dir: Path,
    pending: dict[str, dict[str, tuple[TableShaping, TableShaping]]],
) -> list[threading.Thread]:
    """Carry out every publication's changed shaping (``pending``, read by
    :func:`pending_reshapes` before capture started) in a thread each (capture runs)."""
    threads = []
    for pub in pubs:
        changes = pending.get(pub.name)
        if not changes:
            continue
        if pub.config.snapshot_only:  # each refresh truncates: the new shaping is whole
            _write_record(data_dir, pub)
            continue
        t = threading.Thread(
            target=_run,
            args=(source, pub, data_dir, changes),
            name=f"txrepl-reshape-{pub.name}",
            daemon=True,
        )
        t.start()
        threads.append(t)
    return threads
