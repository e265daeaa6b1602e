"""Planning a batch: its ops walked into steps, the rows' net effect computed (Spark).

Steps 1-3 of the algorithm in :mod:`subscriber.apply.engine` (segments, events,
net effect), as :class:`Planning`, the half of :class:`~subscriber.apply.Applier`
that reads a batch and never writes: the numpy walk (``_walk.py``) with the
Python walk as its reference (:meth:`Planning._plan_python`), barriers one by
one, each segment's events per table (``_events.py``), one Spark job for the net
effect of the plain tables (or the driver's group-by for a small batch,
``_small.py``), the transforms and history versions (``_shape.py``).  A batch of
a few ops, and a plain table's few events, are planned in plain Python
(``_few.py``: the in-sync case, whose cost must follow its size).  All of it
runs inside :func:`~subscriber.apply._spark.spark_errors`, the Spark boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._events import (
    EventBuffer,
    net_effect,
    net_effect_df,
    net_effect_positions,
)
from subscriber.apply._few import few_entries, few_rows_step
from subscriber.apply._shape import history_versions, shaped_rows, target_schema
from subscriber.apply._small import net_effect_positions_local, supported
from subscriber.apply._spark import spark_errors
from subscriber.apply._walk import Unrecognised, Walked, walk
from subscriber.apply._wire import shadow
from subscriber.apply.entry import AnyEntry
from subscriber.apply.errors import ApplyError, SchemaError
from subscriber.apply.lazy import spark_ready
from subscriber.apply.options import ApplyOptions
from subscriber.apply.session import arrow_frame
from subscriber.apply.writer import (
    CallStep,
    HistoryStep,
    RowsStep,
    SchemaStep,
    SqlStep,
    Step,
    TruncateStep,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Planning"]

# Plain ints: attribute access on a protobuf enum wrapper costs ~1 us each, per row.
_INSERT = int(pb.ROW_OP_INSERT)
_UPDATE = int(pb.ROW_OP_UPDATE)
_DELETE = int(pb.ROW_OP_DELETE)
_TRUNCATE = int(pb.ROW_OP_TRUNCATE)
_BARRIERS = {2: "schema", 3: "sql", 4: "call"}  # Op field number -> oneof name
# Segments of fewer row changes are walked op by op: below this, numpy's fixed cost
# per segment and table is more than Python's per op.
_VECTOR_MIN = 32


class Planning:
    """Steps 1-3 of a batch (a base of :class:`~subscriber.apply.Applier`)."""

    _spark: SparkSession
    options: ApplyOptions
    subscription: str
    _shapes: dict[tuple[str, bytes], tuple[pb.TableSchema, list[tuple[str, str]]]]
    _spark_thread: ThreadPoolExecutor | None

    def _net_effect_thread(self) -> ThreadPoolExecutor:
        if self._spark_thread is None:
            self._spark_thread = ThreadPoolExecutor(1, thread_name_prefix="txrepl-net-effect")
        return self._spark_thread

    def _plan(
        self, first_seq: int, entries: Sequence[AnyEntry], schemas: dict[str, pb.TableSchema]
    ) -> tuple[list[Step], int]:
        """Split the batch into steps; ``schemas`` is updated as schema ops pass.

        The ops are read from the serialized entries with numpy (``_walk.py``);
        a batch it does not read, or whose row changes do not fit their schemas
        (an error), takes the Python walk, :meth:`_plan_python`, the reference,
        and so does a batch of a few ops (``_few.py``).
        """
        with spark_errors():  # the Spark boundary: py4j / pyspark errors translated
            shadows = few_entries(entries)
            if shadows is not None:
                return self._plan_python(first_seq, entries, schemas, shadows)
            walked = walk(entries)
            if walked is not None:
                saved = dict(schemas)
                try:
                    return self._plan_walked(first_seq, entries, schemas, walked)
                except Unrecognised:
                    schemas.clear()
                    schemas.update(saved)
            return self._plan_python(first_seq, entries, schemas)

    def _plan_walked(
        self,
        first_seq: int,
        entries: Sequence[AnyEntry],
        schemas: dict[str, pb.TableSchema],
        walked: Walked,
    ) -> tuple[list[Step], int]:
        """:meth:`_plan_python` over a :class:`Walked` batch: barriers one by one in
        Python, the row changes between them (a segment) at once."""
        plan = _Plan(self, first_seq, entries)
        pos = 0
        lo = 0  # the segment's first op
        n = walked.n_ops
        for b in [*walked.barriers(), n]:
            if b > lo:  # ops lo..b-1: row changes
                r0 = int(walked.op_row[lo])
                r1 = r0 + b - lo
                if r1 - r0 >= _VECTOR_MIN:
                    bufs, pos = walked.events(r0, r1, schemas, first_seq, pos)
                    plan.segment.update(bufs)
                else:  # a few row changes: as the Python walk does
                    for r in range(r0, r1):
                        seq = first_seq + int(walked.op_entry[walked.rows[r]])
                        pos = self._row(plan.segment, schemas, walked.row_change(r), seq, pos)
            if b == n:
                break
            seq = first_seq + int(walked.op_entry[b])
            kind = int(walked.op_kind[b])
            if kind == 1:
                self._truncate(plan, walked.table_name(int(walked.op_row[b])), seq, schemas)
            else:
                self._barrier(plan, _BARRIERS[kind], walked.payload(b), seq, schemas)
            lo = b + 1
        return plan.finish(), int(walked.rows.size)

    def _plan_python(
        self,
        first_seq: int,
        entries: Sequence[AnyEntry],
        schemas: dict[str, pb.TableSchema],
        shadows: Sequence[Any] | None = None,
    ) -> tuple[list[Step], int]:
        """The batch's steps, walking its ops in Python (shadow entries, ``_wire.py``;
        ``shadows``: those of ``entries``, already parsed)."""
        plan = _Plan(self, first_seq, entries)
        pos = 0
        rows = 0
        # Row values stay serialized: they are decoded column-wise (_wire.py).
        for i, entry in enumerate(map(shadow, entries) if shadows is None else shadows):
            seq = first_seq + i
            for op in entry.ops:
                kind = op.WhichOneof("kind")
                if kind == "row":
                    change = op.row
                    if change.op == _TRUNCATE:
                        self._truncate(plan, change.table, seq, schemas, change.truncate_options)
                    else:
                        pos = self._row(plan.segment, schemas, change, seq, pos)
                    rows += 1
                elif kind is None:
                    raise ApplyError(
                        "entry holds an empty op", subscription=self.subscription, seq=seq
                    )
                else:
                    self._barrier(plan, kind, getattr(op, kind), seq, schemas)
        return plan.finish(), rows

    def _row(
        self,
        segment: dict[str, EventBuffer],
        schemas: dict[str, pb.TableSchema],
        change: Any,
        seq: int,
        pos: int,
    ) -> int:
        """Append the events of one row change (an ``SRow``, not a TRUNCATE)."""
        cop = change.op
        buf = segment.get(change.table)
        if buf is not None and cop in (_INSERT, _UPDATE):
            # The common cases, inlined: an insert, an update keeping its key.
            row = change.row
            if len(row) == buf.width and (
                cop == _INSERT
                or not (key := change.key)
                or list(key) == [row[k] for k in buf.key_index]
            ):
                buf.seqs.append(seq)
                buf.positions.append(pos)
                buf.deletes.append(False)
                buf.cells.extend(row)
                buf.ops.append(cop)
                return pos + 1
        if buf is None:
            schema = schemas.get(change.table)
            if schema is None:
                raise self._unknown(change.table, seq)
            buf = segment[change.table] = EventBuffer(schema)
        return self._events(buf, seq, pos, change)

    def _truncate(
        self,
        plan: _Plan,
        table: str,
        seq: int,
        schemas: dict[str, pb.TableSchema],
        options: int = 0,  # RowChange.truncate_options (the numpy walk declines them)
    ) -> None:
        if table not in schemas:
            raise self._unknown(table, seq)
        plan.flush()
        opts = self.options.tables.get(table)
        target = (opts and opts.target) or table
        plan.steps.append(TruncateStep(target, bool(options & 1), bool(options & 2)))

    def _barrier(
        self, plan: _Plan, kind: str, payload: bytes, seq: int, schemas: dict[str, pb.TableSchema]
    ) -> None:
        """A schema op, SQL statement or procedure call (``payload``: serialized)."""
        plan.flush()
        if kind == "schema":
            schema_op = pb.TableSchema.FromString(payload)
            self._check_schema(schema_op, seq)
            previous = schemas.get(schema_op.table)
            schemas[schema_op.table] = schema_op
            shaped = self._shape(schema_op, seq)
            plan.steps.append(SchemaStep(schema_op, previous, shaped[0] if shaped else None))
        elif kind == "sql":
            plan.steps.append(SqlStep(pb.SqlStatement.FromString(payload).sql))
        else:
            call = pb.ProcedureCall.FromString(payload)
            plan.steps.append(CallStep(call.name, list(call.args)))

    def _plain_steps(
        self,
        steps: list[Step | None],
        plain: list[tuple[int, EventBuffer]],
        first_seq: int,
        commit_times: Callable[[], pa.Array],
    ) -> None:
        """Net effect of the plain segments: one Spark job, overlapped with decoding.

        Fewer events than ``options.spark_min_rows``, or a session whose JVM is not
        up yet (``lazy.spark_ready`` begins its start): no job, Arrow's group-by here
        (Spark's fixed cost per job would bound the in-sync lag), or, for a table's
        few events, a dict (``_few.py``).  Otherwise the key columns are decoded first
        and handed to Spark in a worker thread; this thread decodes the other columns
        meanwhile, then takes the surviving events by position.
        """
        least = self.options.spark_min_rows
        events = sum(buf.n_events for _, buf in plain)
        local = events < least or bool(least and not spark_ready(self._spark))
        if local:
            plain = self._few_steps(steps, plain, first_seq, commit_times)
            if not plain:
                return
        keys = [buf.keys_table() for _, buf in plain]
        if local and supported(keys):
            # A small batch: the same grouping in this process (``_small.py``).
            winners = net_effect_positions_local(keys)
            tables = [buf.to_arrow() for _, buf in plain]
        else:
            job: Future[list[tuple[np.ndarray, np.ndarray]]] = self._net_effect_thread().submit(
                net_effect_positions, self._spark, keys
            )
            try:
                tables = [buf.to_arrow() for _, buf in plain]
            finally:
                winners = job.result()  # waits even when decoding failed: no job left behind
        for (n, buf), events, (last, first) in zip(plain, tables, winners, strict=True):
            positions = buf.position_array()
            survivors = events.take(pa.array(np.searchsorted(positions, last), pa.int64()))
            deleted = survivors.column("_del").to_numpy(zero_copy_only=False)
            # A key whose first event here is a source INSERT was absent when the
            # segment began (RowsStep.fresh): its row goes first among the upserts.
            ops = events.column("_op").to_numpy()
            born = ops[np.searchsorted(positions, first)] == _INSERT
            # For conflict detection (subscriber/targets/conflicts): each key's first
            # event, and the source commit time of its last.
            survivors = survivors.append_column("_born", pa.array(born))
            if self.options.commit_times:
                at = pc.subtract(survivors.column("_seq"), first_seq)
                survivors = survivors.append_column("_commit_us", pc.take(commit_times(), at))
            fresh = np.flatnonzero(born & ~deleted)
            rest = np.flatnonzero(~born & ~deleted)
            shaped = self._shape(buf.schema, first_seq)  # a renamed target table
            steps[n] = RowsStep(
                shaped[0] if shaped else buf.schema,
                survivors.filter(pa.array(deleted)),
                survivors.take(pa.array(np.concatenate([fresh, rest]), pa.int64())),
                fresh=len(fresh),
            )

    def _few_steps(
        self,
        steps: list[Step | None],
        plain: list[tuple[int, EventBuffer]],
        first_seq: int,
        commit_times: Callable[[], pa.Array],
    ) -> list[tuple[int, EventBuffer]]:
        """The steps of the plain tables of few events (``_few.py``); the others returned."""
        times = commit_times if self.options.commit_times else None
        left = []
        for n, buf in plain:
            shaped = self._shape(buf.schema, first_seq)  # a renamed target table
            step = few_rows_step(buf, shaped[0] if shaped else buf.schema, first_seq, times)
            if step is None:
                left.append((n, buf))
            else:
                steps[n] = step
        return left

    def _unknown(self, table: str, seq: int) -> SchemaError:
        return SchemaError(
            "row change for a table whose schema has not been received",
            subscription=self.subscription,
            seq=seq,
            table=table,
        )

    def _check_schema(self, schema: pb.TableSchema, seq: int) -> None:
        names = [c.name for c in schema.columns]
        if not schema.table or not names:
            raise SchemaError(
                "schema op needs a table name and at least one column",
                subscription=self.subscription,
                seq=seq,
                table=schema.table,
            )
        if len(set(names)) != len(names):
            raise SchemaError(
                "schema op repeats a column name",
                subscription=self.subscription,
                seq=seq,
                table=schema.table,
            )
        if not schema.primary_key or any(k not in names for k in schema.primary_key):
            raise SchemaError(
                "schema op needs a primary key made of its columns "
                "(tables without a primary key are not supported yet)",
                subscription=self.subscription,
                seq=seq,
                table=schema.table,
            )

    def _events(self, buf: EventBuffer, seq: int, pos: int, change: Any) -> int:
        """Append the events of one row change (an ``SRow``); return the next free position.

        Values are serialized ``Value`` bytes here: an update's key changed when its
        serialized key differs from the key cells of its row.
        """
        op = change.op
        if op in (_INSERT, _UPDATE):
            row = change.row
            if len(row) != buf.width:
                raise self._bad(
                    f"row has {len(row)} values, the table {buf.width} columns", seq, change
                )
            if op == _UPDATE and change.key:
                old = list(change.key)
                if old != [row[i] for i in buf.key_index]:
                    buf.add(seq, pos, True, self._key_row(buf, old, seq, change), _DELETE)
                    pos += 1
            buf.add(seq, pos, False, row, op)
            return pos + 1
        if op == _DELETE:
            buf.add(seq, pos, True, self._key_row(buf, list(change.key), seq, change), op)
            return pos + 1
        raise self._bad(f"unknown row op {op}", seq, change)

    def _bad(self, what: str, seq: int, change: Any) -> SchemaError:
        return SchemaError(what, subscription=self.subscription, seq=seq, table=change.table)

    def _key_row(self, buf: EventBuffer, key: list[bytes], seq: int, change: Any) -> list[bytes]:
        if len(key) != len(buf.key_index):
            raise self._bad(
                f"key has {len(key)} values, the primary key {len(buf.key_index)}", seq, change
            )
        cells = [b""] * buf.width  # NULL
        for idx, value in zip(buf.key_index, key, strict=True):
            cells[idx] = value
        return cells

    def _shape(
        self, schema: pb.TableSchema, seq: int
    ) -> tuple[pb.TableSchema, list[tuple[str, str]]] | None:
        """The target schema and column expressions of a shaped table (None: as is)."""
        opts = self.options.tables.get(schema.table)
        if opts is None or not opts.shaped:
            return None
        key = (schema.table, schema.SerializeToString())
        cached = self._shapes.get(key)
        if cached is None:
            try:
                cached = target_schema(self._spark, schema, opts, seq)
            except SchemaError as exc:
                raise SchemaError(str(exc), subscription=self.subscription) from exc
            self._shapes[key] = cached
        return cached

    def _rows_step(self, buf: EventBuffer, first_seq: int, commit_times: pa.Array) -> Step:
        events = buf.to_arrow()
        source = buf.schema
        names = [c.name for c in source.columns]
        key_cols = [events.column_names[3 + names.index(k)] for k in source.primary_key]
        opts = self.options.tables.get(source.table)
        shaped = self._shape(source, first_seq)
        if opts is not None and shaped is not None:
            target, exprs = shaped
            df = arrow_frame(self._spark, events)
            if opts.history:
                versions = history_versions(df, source, key_cols, commit_times, first_seq)
                return HistoryStep(target, versions)
            if opts.transforms:
                deletes, upserts = shaped_rows(net_effect_df(df, key_cols), source, opts, exprs)
                return RowsStep(target, deletes, upserts)
        survivors = net_effect(self._spark, events, key_cols)
        flags = survivors.column("_del")
        deletes = survivors.filter(flags)
        upserts = survivors.filter(pc.invert(flags))
        return RowsStep(shaped[0] if shaped else source, deletes, upserts)


class _Plan:
    """The steps of one batch as its ops pass (both walks of :meth:`Applier._plan`)."""

    def __init__(self, applier: Planning, first_seq: int, entries: Sequence[AnyEntry]) -> None:
        self.applier = applier
        self.first_seq = first_seq
        self.entries = entries
        self.steps: list[Step | None] = []
        self.segment: dict[str, EventBuffer] = {}  # the open segment's events, per table
        self.plain: list[tuple[int, EventBuffer]] = []  # (step index, events): one Spark job
        self._commit_times: pa.Array | None = None

    def commit_times(self) -> pa.Array:
        if self._commit_times is None:
            self._commit_times = pa.array([e.commit_time_us for e in self.entries], pa.int64())
        return self._commit_times

    def flush(self) -> None:
        """Close the open segment: one step per table, in order of first appearance."""
        tables = self.applier.options.tables
        for buf in self.segment.values():
            opts = tables.get(buf.schema.table)
            if opts is None or not (opts.history or opts.transforms):
                self.plain.append((len(self.steps), buf))
                self.steps.append(None)  # filled in after the batch's net-effect job
            else:
                self.steps.append(self.applier._rows_step(buf, self.first_seq, self.commit_times()))
        self.segment.clear()

    def finish(self) -> list[Step]:
        self.flush()
        if self.plain:
            self.applier._plain_steps(self.steps, self.plain, self.first_seq, self.commit_times)
        assert None not in self.steps
        return self.steps  # type: ignore[return-value]
