"""Conflict detection and resolution inside a batch's transaction.

A writer whose subscription is updatable hands each plain rows step of a checked
table to :meth:`ConflictGuard.resolve` before writing it, and calls
:meth:`ConflictGuard.finish` after; both run on the writer's connection inside the
batch's transaction, so a conflict's resolution, its log row and the level commit
or roll back together (exactly once, as every write of a batch).

Detection per key of the step (its first event in the batch says what the
publisher expected: ``_born``, a source INSERT, expects no row; anything else
expects the row as last replicated):

=========================  ================================================
publisher                  conflict
=========================  ================================================
insert (born)              the target has the key: ``insert_exists``
update / delete            the target lacks the row: ``update_missing`` /
                           ``delete_missing``
update / delete            the target's row differs from the version txrepl
                           recorded when it last wrote it: ``update_changed``
                           / ``delete_changed``
upsert                     another target row (another key) holds the row's
                           value of a unique key: ``unique_collision``
=========================  ================================================

The version is ``txrepl_row_versions``: per (subscription, table, key) a hash of the
row as this writer last left it (read back after the step, so both dialects hash
what their driver reads), or ``-`` when it left the key absent.  A conflict is
decided once: the row as resolved becomes the key's version, so the publisher's
next change of it applies unless the row changes here again.  A row with no
version (replicated before detection was turned on, or loaded by a snapshot) is
trusted.  The entries carry no before image
(``RowChange`` has the key and the new row only): docs/conflicts.md says why a
version kept by txrepl was chosen over carrying one.

Resolution (``subscriber.conflictspec``): ``take_publisher`` leaves the change in the
step; ``ignore`` takes it out; ``apply`` / ``republish`` take it out and write the
resolver's row after the step (``republish`` as a local change: outside the
replica marker, so a publication of this target captures it; on PostgreSQL in a
transaction of its own after the batch's, ``_republish.py`` says why and how).  A unique collision
resolved for the publisher deletes the other target row first.  Every conflict is a
row of ``txrepl_conflicts`` holding both rows, so the losing one is kept.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from common.names import quote_ident
from subscriber.apply.errors import WriterError
from subscriber.apply.writer import RowsStep, column_of, python_values
from subscriber.conflictspec import ResolverSpec
from subscriber.targets.conflicts._model import (
    Conflict,
    Resolution,
    builtin_resolution,
    jsonable,
    python_resolution,
    row_json,
)
from subscriber.targets.conflicts._republish import drain, record
from subscriber.targets.conflicts._sql import ConflictSql

__all__ = ["ConflictGuard", "ConflictPolicy"]

Row = dict[str, Any]
ABSENT = "-"  # the version of a key whose row txrepl left absent


@dataclass(frozen=True)
class ConflictPolicy:
    """One updatable subscription: its resolver, per-table overrides (None: off)."""

    resolver: ResolverSpec
    tables: Mapping[str, ResolverSpec | None] = field(default_factory=dict)
    time_column: str = ""
    # A pair: a row with no version is a local change, "ignore" keeps the old version.
    pair: bool = False

    def for_table(self, table: str) -> ResolverSpec | None:
        return self.tables.get(table, self.resolver)


@dataclass
class _Pending:
    """What :meth:`ConflictGuard.finish` does after the step is written."""

    step: RowsStep  # the original step (every key gets its version)
    writes: list[tuple[Row, Row | None, bool]]  # (key, row or None: delete, republish)
    stale: set[str] = field(default_factory=set)  # keys whose version stays (a pair's ignore)


def _rows(table: pa.Table, schema: Any, indexes: list[int]) -> list[Row]:
    cols = []
    for i in indexes:
        col, variant = column_of(table, i)
        cols.append(python_values(col, schema.columns[i], variant))
    names = [schema.columns[i].name for i in indexes]
    return [dict(zip(names, cells, strict=True)) for cells in zip(*cols, strict=True)]


def _column(table: pa.Table, name: str, default: object, n: int) -> list[Any]:
    if name in table.column_names:
        out: list[Any] = table.column(name).to_pylist()
        return out
    return [default] * n


def _key_text(key: Row) -> str:
    return json.dumps({k: jsonable(v) for k, v in key.items()}, sort_keys=True, default=str)


def _hash(row: Row) -> str:
    return hashlib.sha1((row_json(row) or "").encode()).hexdigest()


def _version(row: Row | None) -> str:
    """A key's version: the hash of its row, or ABSENT."""
    return _hash(row) if row else ABSENT


def _kind(
    local: Row | None, version: str | None, born: bool, is_up: bool, unversioned: bool
) -> str | None:
    """The conflict of one key (None: none); ``version``: the recorded one, if any;
    ``unversioned``: a row without one is a local change (else it is trusted)."""
    if born:
        return "insert_exists" if local is not None else None
    if local is None:
        return "update_missing" if is_up else "delete_missing"
    if (version is None and unversioned) or (version is not None and version != _hash(local)):
        return "update_changed" if is_up else "delete_changed"
    return None


class ConflictGuard:
    """Conflict checks of one writer, for the updatable subscriptions in ``policies``."""

    def __init__(self, sql: ConflictSql, policies: Mapping[str, ConflictPolicy]) -> None:
        self.sql = sql
        self.policies = dict(policies)
        self._ready = False
        self._seeded = False
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._pending_counts: dict[tuple[str, str], int] = {}
        # republished rows may wait in txrepl_republish (a crash after their batch's
        # commit): look once, and after each batch that left some (_republish.py)
        self.republish_due = sql.republish_after

    # -- counts (status, metrics) ---------------------------------------------------

    def counts(self, subscription: str | None = None) -> dict[tuple[str, str], int]:
        """Conflicts committed so far, by (subscription, table)."""
        with self._lock:
            return {k: v for k, v in self._counts.items() if subscription in (None, k[0])}

    def committed(self) -> None:
        with self._lock:
            for k, v in self._pending_counts.items():
                self._counts[k] = self._counts.get(k, 0) + v
            self._pending_counts.clear()

    def rolled_back(self) -> None:
        with self._lock:
            self._pending_counts.clear()
        self._ready = False  # the tables' creation may have rolled back with it

    def _prepare(self, conn: Any) -> None:
        if not self._ready:
            for stmt in self.sql.ddl:
                self.sql.run(conn, stmt, ())
            self._ready = True
        if not self._seeded:
            got = self.sql.run(
                conn,
                "SELECT subscription, table_name, count(*) FROM txrepl_conflicts "
                "GROUP BY subscription, table_name",
                (),
            )
            with self._lock:
                for sub, table, n in got:
                    self._counts[(sub, table)] = int(n)
            self._seeded = True

    # -- the step ---------------------------------------------------------------------

    def spec(self, subscription: str, table: str) -> ResolverSpec | None:
        policy = self.policies.get(subscription)
        return None if policy is None else policy.for_table(table)

    def resolve(
        self, conn: Any, subscription: str, step: RowsStep
    ) -> tuple[RowsStep, _Pending | None]:
        """``step`` without the changes its conflicts' decisions take out, and what
        :meth:`finish` writes after it (None: the table is not checked)."""
        schema = step.schema
        spec = self.spec(subscription, schema.table)
        if spec is None:
            return step, None
        self._prepare(conn)
        policy = self.policies[subscription]
        names = [c.name for c in schema.columns]
        key_idx = [names.index(k) for k in schema.primary_key]
        ups = _rows(step.upserts, schema, list(range(len(names))))
        dels = _rows(step.deletes, schema, key_idx)
        n_up, n_del = len(ups), len(dels)
        born_up = _column(step.upserts, "_born", None, n_up)
        born_up = [b if b is not None else i < step.fresh for i, b in enumerate(born_up)]
        born_del = _column(step.deletes, "_born", False, n_del)
        seqs = _column(step.upserts, "_seq", 0, n_up) + _column(step.deletes, "_seq", 0, n_del)
        times = _column(step.upserts, "_commit_us", 0, n_up)
        times += _column(step.deletes, "_commit_us", 0, n_del)
        step_keys = {_key_text({k: r[k] for k in schema.primary_key}) for r in ups + dels}
        uniques = self.sql.unique_keys(conn, schema.table) if ups else []
        pending = _Pending(step, [])
        keep_up: list[int] = []
        keep_del: list[int] = []
        log: list[tuple[object, ...]] = []  # txrepl_conflicts rows, written at once
        keys = [{k: pub[k] for k in schema.primary_key} for pub in ups + dels]
        locals_ = self._fetch_all(conn, schema, keys)
        versions = self._versions(conn, subscription, schema.table, keys)
        for i, pub in enumerate(ups + dels):
            is_up = i < n_up
            key, local = keys[i], locals_[i]
            born = born_up[i] if is_up else born_del[i - n_up]
            kind = _kind(local, versions[i], born, is_up, policy.pair)
            other: Row | None = None
            if kind is None and is_up:
                other = self._collision(conn, schema, pub, uniques, step_keys)
                if other is not None:
                    kind, local = "unique_collision", other
            keep = (keep_up, keep_del)[not is_up]
            if kind is None:
                keep.append(i if is_up else i - n_up)
                continue
            conflict = Conflict(
                subscription,
                schema.table,
                kind,
                key,
                pub if is_up else None,
                local,
                int(seqs[i] or 0),
                int(times[i] or 0),
            )
            res = self._decide(conn, spec, policy, conflict)
            if other is not None and res.decision != "ignore":
                self._delete(conn, schema, {k: other[k] for k in schema.primary_key})
            if res.decision == "take_publisher":
                keep.append(i if is_up else i - n_up)
                applied = conflict.publisher_row
            elif res.decision == "ignore":
                applied = local if kind != "unique_collision" else None
                if policy.pair:
                    pending.stale.add(_key_text(key))
            else:
                row = None if res.row is None else dict(res.row)
                pending.writes.append((key, row, res.decision == "republish"))
                applied = res.row
            log.append(self._log_row(conflict, spec, res.decision, applied))
        self._log(conn, log)
        resolved = RowsStep(
            schema,
            step.deletes.take(pa.array(keep_del, pa.int64())),
            step.upserts.take(pa.array(keep_up, pa.int64())),
            fresh=sum(1 for i in keep_up if i < step.fresh),
        )
        return resolved, pending

    def finish(self, conn: Any, subscription: str, pending: _Pending | None) -> None:
        """After the step: the resolvers' rows, then every key's version."""
        if pending is None:
            return
        schema = pending.step.schema
        after: list[tuple[Row, Row | None]] = []  # republished after the commit
        for key, row, republish in pending.writes:
            if republish and self.sql.republish_after:
                after.append((key, None if row is None else {**row, **key}))
                continue
            if republish:
                for stmt in self.sql.local_begin:
                    self.sql.run(conn, stmt, ())
            if row is None:
                self._delete(conn, schema, key)
            else:
                self._upsert(conn, schema, {**row, **key})
            if republish:
                for stmt in self.sql.local_end:
                    self.sql.run(conn, stmt, ())
        names = [c.name for c in schema.columns]
        key_idx = [names.index(k) for k in schema.primary_key]
        keys = _rows(pending.step.upserts, schema, key_idx)
        keys += _rows(pending.step.deletes, schema, key_idx)
        m = self.sql.mark
        # An absent row is versioned too (ABSENT): a row that appears here later is a
        # local change, not a row of before detection.
        params = [
            (subscription, schema.table, _key_text(key), _version(local))
            for key, local in zip(keys, self._fetch_all(conn, schema, keys), strict=True)
            if _key_text(key) not in pending.stale
        ]
        if after:
            now = {p[2]: p[3] for p in params}
            keyed = [(k, _key_text(k), row) for k, row in after]
            record(
                self.sql, conn, subscription, schema.table, names,
                [(k, text, row, now[text]) for k, text, row in keyed],
            )  # fmt: skip
            self.republish_due = True
        self.sql.run_many(
            conn,
            "INSERT INTO txrepl_row_versions (subscription, table_name, row_key, "
            f"row_hash) VALUES ({m}, {m}, {m}, {m}) ON CONFLICT (subscription, "
            "table_name, row_key) DO UPDATE SET row_hash = excluded.row_hash "
            "RETURNING row_key",
            params,
        )

    def drain_republished(self, conn: Any) -> int:
        """Write the republished rows left by committed batches (PostgreSQL), in the
        caller's transaction, which must have no replication origin; the number."""
        self._prepare(conn)
        return drain(self.sql, conn, _version)

    # -- pieces -------------------------------------------------------------------------

    def _versions(self, conn: Any, subscription: str, table: str, keys: list[Row]) -> list[Any]:
        """Each key's recorded version (None: none)."""
        m = self.sql.mark
        got = self.sql.run_many(
            conn,
            f"SELECT row_hash FROM txrepl_row_versions WHERE subscription = {m} "
            f"AND table_name = {m} AND row_key = {m}",
            [(subscription, table, _key_text(k)) for k in keys],
        )
        return [rows[0][0] if rows else None for rows in got]

    def _where(self, cols: list[str]) -> str:
        return " AND ".join(f"{quote_ident(c)} = {self.sql.mark}" for c in cols)

    def _fetch_all(self, conn: Any, schema: Any, keys: list[Row]) -> list[Row | None]:
        """The target's row of each key (None: absent)."""
        if not keys:
            return []
        names = [c.name for c in schema.columns]
        got = self.sql.run_many(
            conn,
            f"SELECT {', '.join(quote_ident(n) for n in names)} FROM "
            f"{self.sql.table(schema.table)} WHERE {self._where(list(keys[0]))}"
            f"{self.sql.lock_rows}",
            [[self.sql.bind(v) for v in key.values()] for key in keys],
        )
        return [dict(zip(names, rows[0], strict=True)) if rows else None for rows in got]

    def _collision(
        self, conn: Any, schema: Any, pub: Row, uniques: list[list[str]], step_keys: set[str]
    ) -> Row | None:
        """Another target row (not changed by this step) holding a unique key of ``pub``."""
        names = [c.name for c in schema.columns]
        for cols in uniques:
            if any(pub.get(c) is None for c in cols) or any(c not in pub for c in cols):
                continue
            got = self.sql.run(
                conn,
                f"SELECT {', '.join(quote_ident(n) for n in names)} FROM "
                f"{self.sql.table(schema.table)} WHERE {self._where(cols)}",
                [self.sql.bind(pub[c]) for c in cols],
            )
            for cells in got:
                row = dict(zip(names, cells, strict=True))
                if _key_text({k: row[k] for k in schema.primary_key}) not in step_keys:
                    return row
        return None

    def _delete(self, conn: Any, schema: Any, key: Row) -> None:
        self.sql.run(
            conn,
            f"DELETE FROM {self.sql.table(schema.table)} WHERE {self._where(list(key))}",
            [self.sql.bind(v) for v in key.values()],
        )

    def _upsert(self, conn: Any, schema: Any, row: Row) -> None:
        cols = [c.name for c in schema.columns if c.name in row]
        rest = [c for c in cols if c not in schema.primary_key]
        sets = ", ".join(f"{quote_ident(c)} = excluded.{quote_ident(c)}" for c in rest)
        action = f"DO UPDATE SET {sets}" if rest else "DO NOTHING"
        self.sql.run(
            conn,
            f"INSERT INTO {self.sql.table(schema.table)} "
            f"({', '.join(quote_ident(c) for c in cols)}) VALUES "
            f"({', '.join(self.sql.mark for _ in cols)}) ON CONFLICT "
            f"({', '.join(quote_ident(k) for k in schema.primary_key)}) {action}",
            [self.sql.bind(row[c]) for c in cols],
        )

    def _decide(
        self, conn: Any, spec: ResolverSpec, policy: ConflictPolicy, conflict: Conflict
    ) -> Resolution:
        """The resolver's decision; a user resolver's failure is the batch's WriterError
        (stored or stopping as the error policy says), naming the resolver and key."""
        try:
            return self._resolution(conn, spec, policy, conflict)
        except WriterError:
            raise
        except Exception as exc:
            raise WriterError(
                f"conflict resolver {spec.text!r} failed on {conflict.kind} of table "
                f"{conflict.table!r} key {_key_text(dict(conflict.key))}: {exc}",
                subscription=conflict.subscription,
                seq=conflict.seq or None,
            ) from exc

    def _resolution(
        self, conn: Any, spec: ResolverSpec, policy: ConflictPolicy, conflict: Conflict
    ) -> Resolution:
        if spec.kind == "python":
            return python_resolution(spec, conflict)
        if spec.kind == "sql":
            pub = dict(conflict.publisher_row or conflict.key)
            loc = dict(conflict.local_row or {})
            got = self.sql.evaluate(conn, conflict.table, spec.sql, pub, loc)
            decision = str(got)
            row = conflict.publisher_row if decision in ("apply", "republish") else None
            return Resolution(decision, row)
        return builtin_resolution(spec, conflict, policy.time_column)

    def _log_row(
        self, conflict: Conflict, spec: ResolverSpec, decision: str, applied: Any
    ) -> tuple[object, ...]:
        with self._lock:
            k = (conflict.subscription, conflict.table)
            self._pending_counts[k] = self._pending_counts.get(k, 0) + 1
        return (
            conflict.subscription,
            conflict.seq,
            conflict.table,
            conflict.kind,
            _key_text(dict(conflict.key)),
            row_json(conflict.publisher_row),
            row_json(conflict.local_row),
            row_json(applied),
            spec.text,
            decision,
            conflict.commit_time_us,
            dt.datetime.now(dt.UTC).isoformat(),
        )

    def _log(self, conn: Any, rows: list[tuple[object, ...]]) -> None:
        if rows:
            self.sql.run_many(
                conn,
                "INSERT INTO txrepl_conflicts (subscription, seq, table_name, kind, row_key, "
                "publisher_row, local_row, applied_row, resolver, decision, commit_time_us, "
                f"created_at) VALUES ({', '.join([self.sql.mark] * 12)}) RETURNING id",
                rows,
            )
