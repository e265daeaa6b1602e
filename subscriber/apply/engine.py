"""Apply a batch of consecutive entries to the target through Spark, exactly once.

Algorithm, for a batch ``(first_seq, entries)``; entry ``i`` has seq ``first_seq + i``:

1. **Segments.**  Walk the ops in order (entry by entry, op by op).  A schema op,
   a SQL statement, a procedure call or a TRUNCATE is a *barrier*: it closes the
   current segment and becomes a step of its own.  Row changes between barriers
   form a segment.  Schemas are tracked in a copy of the subscription's schemas,
   so a row change is always read against its table's schema as of that op.
   The walk reads the serialized entries with numpy (``_walk.py``: barriers one
   by one, the row changes of a segment at once); a batch in a form it does not
   read, or with a row change that does not fit its schema, is walked op by op
   in Python (:meth:`Applier._plan_python`, the reference, which raises the error).
2. **Events.**  Each row change becomes events of its table, numbered by a
   batch-wide position ``_pos`` that increases in op order:
   INSERT -> upsert(row); DELETE -> delete(key);
   UPDATE -> upsert(row), preceded by delete(old key) when the key changed
   (a key change is a delete of the old key plus an insert of the new one).
3. **Net effect (Spark).**  The last event per key and segment wins.  For the
   plain tables of the batch, ONE Spark job computes it: the key columns and
   ``_pos`` of every segment go to Spark as one Arrow table
   (``createDataFrame(pyarrow.Table)``, ``_s`` numbering the segment), which
   groups by ``(_s, key)`` and keeps ``max(_pos)`` (``_pos`` increases in op
   order, so it orders events exactly as ``(_seq, _pos)``); ``toArrow()`` brings
   the winning positions back, and the surviving events are taken from the
   segments' Arrow event tables by position; ``_del`` splits them into deletes
   and upserts.  While Spark computes, this thread decodes the other columns
   (Spark runs in the JVM, so the two overlap on two cores).  Tables with
   transforms or history send their whole event table to Spark (a window over
   the key ordered by ``(_seq, _pos)`` descending, ``row_number() = 1``, then
   Spark SQL).  This is correct because, within a segment, the state of a key
   after all its events depends only on its last event (an upsert writes the
   whole row, a delete removes it), and events of different keys commute.
   Barriers are never reordered with the rows around them.
4. **Write.**  The writer runs, in ONE target transaction: re-read the level row
   under the target's write lock and refuse unless ``level + 1 == first_seq`` (and
   the incarnation matches), then each step in order (DDL, deletes, then upserts
   per table segment), then the new level row (``level = first_seq + n - 1``),
   then commit.

Errors: a :class:`TransientError` of the writer (connection lost, lock timeout,
serialization failure) is retried with exponential backoff, up to
``options.retries`` attempts.  Any other :class:`ApplyError` (a constraint, bad
data, a schema problem) is *narrowed*: the batch is split in halves, recursively,
each half applied on its own (committing the good ones and moving the level), until
the failing entry is alone.  That entry is stored whole in ``txrepl_errors`` (in a
transaction that checks the level is just before it); then, by ``error_policy``,
either :class:`PoisonEntryError` is raised (``stop``, the default: the level stays
just before the entry) or the level moves past it and the rest of the batch is
applied (``skip``).  Cost of narrowing: about ``2 log2(n)`` applies for a batch of
``n`` entries, only on failure.

Planning ahead: steps 1-3 of a batch can run on their own (:meth:`Applier.plan`),
in another thread while the batch before it is written (step 4), against the
schemas that batch leaves.  :meth:`Applier.apply` writes such a plan only if it was
made against the very schemas dict the subscription holds at that moment (nothing
else applied or reloaded since) and planned cleanly; otherwise it plans again.
Only the writing thread moves the level, so this changes nothing below.

Atomicity: Spark only computes; nothing reaches the target before step 4, and
step 4 is a single database transaction holding both the rows and the level.  A
crash (SIGKILL, power loss) before the commit is durable leaves the target exactly
as of the old level; after it, exactly as of the new level (SQLite: WAL with
``synchronous=FULL``, so a commit that returned is on disk).  Because the level
check is inside the same transaction, a batch can never be applied twice: a
re-sent or overlapping batch fails the check and changes nothing.  The in-memory
schema cache is replaced only after the commit returns.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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
from subscriber.apply._shape import history_versions, shaped_rows, target_schema
from subscriber.apply._small import net_effect_positions_local, supported
from subscriber.apply._walk import Unrecognised, Walked, walk
from subscriber.apply._wire import shadow
from subscriber.apply.entry import AnyEntry
from subscriber.apply.errors import (
    ApplyError,
    GapError,
    PoisonEntryError,
    SchemaError,
    TransientError,
)
from subscriber.apply.options import ApplyOptions
from subscriber.apply.session import arrow_frame
from subscriber.apply.writer import (
    CallStep,
    HistoryStep,
    RowsStep,
    SchemaStep,
    SqlStep,
    Step,
    SubscriptionState,
    TruncateStep,
    Writer,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Applier", "ApplyResult", "Planned"]

# Plain ints: attribute access on a protobuf enum wrapper costs ~1 us each, per row.
_INSERT = int(pb.ROW_OP_INSERT)
_UPDATE = int(pb.ROW_OP_UPDATE)
_DELETE = int(pb.ROW_OP_DELETE)
_TRUNCATE = int(pb.ROW_OP_TRUNCATE)
_BARRIERS = {2: "schema", 3: "sql", 4: "call"}  # Op field number -> oneof name
# Segments of fewer row changes are walked op by op: below this, numpy's fixed cost
# per segment and table is more than Python's per op.
_VECTOR_MIN = 32


@dataclass(frozen=True)
class ApplyResult:
    """The outcome of one applied batch."""

    level: int  # the new level: the batch's last seq
    rows: int  # row changes in the batch (inserts, updates, deletes)
    written: int  # target rows deleted or upserted after net effect
    entries: int
    seconds: float  # wall time of the whole apply (Spark and target)
    skipped: tuple[int, ...] = ()  # seqs stored in txrepl_errors and skipped (policy skip)
    plan_seconds: float = 0.0  # of which planning (walk, decoding, net effect), if done here
    planned_ahead: bool = False  # the plan was made by plan() while the previous batch wrote


@dataclass(frozen=True, eq=False)
class Planned:
    """A batch planned ahead by :meth:`Applier.plan` (steps not yet written).

    ``base`` is the schemas dict it was planned against (identity matters: the plan
    is used only if the subscription's schemas are that very object when the batch
    is applied, i.e. nothing else was applied or reloaded since); ``schemas`` is
    the dict after its schema ops.  ``error`` is what planning raised, if anything.
    """

    first_seq: int
    count: int
    base: dict[str, pb.TableSchema]
    schemas: dict[str, pb.TableSchema]
    steps: list[Step] | None
    rows: int
    seconds: float
    error: BaseException | None = None


class Applier:
    """Applies the batches of one subscription to one target, through Spark."""

    def __init__(
        self,
        spark: SparkSession,
        writer: Writer,
        subscription: str,
        *,
        options: ApplyOptions | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not subscription:
            raise ValueError("Applier.subscription: must not be empty")
        self._spark = spark
        self._writer = writer
        self.subscription = subscription
        self._state: SubscriptionState | None = None
        self._sleep = sleep
        self._shapes: dict[tuple[str, bytes], tuple[pb.TableSchema, list[tuple[str, str]]]] = {}
        self._spark_thread: ThreadPoolExecutor | None = None  # the net-effect job
        self._last_plan_s = 0.0
        self.options = ApplyOptions()
        self.configure(options or ApplyOptions())

    @property
    def writer(self) -> Writer:
        return self._writer

    def configure(self, options: ApplyOptions | Any) -> None:
        """Set the options: an :class:`ApplyOptions` or a ``subscriber.config.ApplyConfig``."""
        if not isinstance(options, ApplyOptions):
            options = ApplyOptions.from_config(options)
        self.options = options
        self._shapes.clear()
        use_jdbc = getattr(self._writer, "use_spark_jdbc", None)
        if use_jdbc is not None:  # PostgreSQL: big rows steps staged by Spark over JDBC
            use_jdbc(self._spark, options.jdbc_min_rows)

    def load_state(self) -> SubscriptionState:
        """Read the subscription's level, incarnation and schemas from the target.

        The first call on a SparkSession also runs a net-effect job of the common
        shape (one BIGINT key, 50k rows; ``WARM_UP_JOBS`` times), so that the JVM
        has loaded and compiled that path before the subscription connects, instead
        of during its first batch (measured: the first W1 catch-up batch took 6 s
        against 0.6-0.9 s for the next ones while the job only started in the
        background).  It waits at most ``WARM_UP_WAIT_S``; jobs still running then
        (a cluster without executors) go on in the background.
        """
        self._state = self._writer.load_state(self.subscription)
        self._warm_up()
        return self._state

    WARM_UP_WAIT_S = 60.0
    # The JVM compiles the job's code over its first runs: measured on 2 cores, a
    # 72k-key job cost the JVM 0.67, 0.62, 0.43, 0.39 s of CPU in runs 2-5, then
    # ~0.3 s.  Three runs at start-up (about 1 s) take most of that off the first
    # batches of a catch-up.
    WARM_UP_JOBS = 3

    def _warm_up(self) -> None:
        spark: Any = self._spark
        if getattr(spark, "_txrepl_warm", False):
            return
        spark._txrepl_warm = True
        n = 50_000
        keys = pa.table(
            {
                "_pos": pa.array(np.arange(n), pa.int64()),
                "c0": pa.array(np.arange(n) % (n // 2), pa.int64()),
            }
        )

        def jobs() -> None:
            for _ in range(self.WARM_UP_JOBS):
                net_effect_positions(self._spark, [keys])

        job = self._net_effect_thread().submit(jobs)
        with contextlib.suppress(Exception):  # a broken Spark shows on the first batch
            job.result(timeout=self.WARM_UP_WAIT_S)

    def _net_effect_thread(self) -> ThreadPoolExecutor:
        if self._spark_thread is None:
            self._spark_thread = ThreadPoolExecutor(1, thread_name_prefix="txrepl-net-effect")
        return self._spark_thread

    @property
    def state(self) -> SubscriptionState:
        if self._state is None:
            return self.load_state()
        return self._state

    def plan(
        self, first_seq: int, entries: Sequence[AnyEntry], *, after: Planned | None = None
    ) -> Planned:
        """Plan a batch without writing it: walk, decoding and net effect (Spark).

        ``after``: the plan of the batch before this one, not yet committed, so the
        two overlap (this one plans while that one writes).  Never raises for the
        batch's content: the error is kept in the result and :meth:`apply` then
        takes its usual path (narrowing).  Safe to run in one thread while
        :meth:`apply` writes in another; at most one ``plan`` at a time.
        """
        started = time.perf_counter()
        base = after.schemas if after is not None else self.state.schemas
        schemas = dict(base)
        if after is not None and after.error is not None:
            error: BaseException = ApplyError(
                "the batch before failed to plan", subscription=self.subscription, seq=first_seq
            )
            return Planned(first_seq, len(entries), base, schemas, None, 0, 0.0, error)
        try:
            steps, rows = self._plan(first_seq, entries, schemas)
        except Exception as exc:  # kept: apply() re-plans (and narrows) on its own
            return Planned(
                first_seq, len(entries), base, schemas, None, 0, time.perf_counter() - started, exc
            )
        return Planned(
            first_seq, len(entries), base, schemas, steps, rows, time.perf_counter() - started
        )

    def apply(
        self,
        first_seq: int,
        entries: Sequence[AnyEntry],
        *,
        incarnation: str,
        planned: Planned | None = None,
    ) -> ApplyResult:
        """Apply the batch and move the level, in one target transaction.

        ``planned``: this batch's :meth:`plan`, used when it was planned against
        the subscription's current schemas and planned cleanly; otherwise ignored.

        Raises :class:`GapError` when ``first_seq`` is not ``level + 1`` or the
        incarnation differs from the stored one.  A persistent failure is narrowed
        to its entry (see the module docstring): :class:`PoisonEntryError` then
        says where the level now stands (policy ``stop``), or, with policy
        ``skip``, the result lists the skipped seqs.  A :class:`TransientError`
        that outlasts the retries is raised as is; then, as for every other
        :class:`ApplyError`, the target's level is :attr:`state`'s after
        :meth:`load_state` (entries committed before the failure stay committed).
        """
        started = time.perf_counter()
        state = self.state
        if not entries:
            return ApplyResult(state.level, 0, 0, 0, time.perf_counter() - started)
        if first_seq != state.level + 1:
            # Re-read: another process may have moved the level (the writer checks again).
            state = self.load_state()
        self._check(state, first_seq, incarnation)
        self._last_plan_s = 0.0
        ahead = (
            planned is not None
            and planned.error is None
            and planned.first_seq == first_seq
            and planned.count == len(entries)
            and planned.base is state.schemas
        )
        rows, written, skipped = self._apply_or_narrow(
            first_seq, entries, incarnation, None, planned if ahead else None
        )
        last_seq = first_seq + len(entries) - 1
        return ApplyResult(
            last_seq,
            rows,
            written,
            len(entries),
            time.perf_counter() - started,
            tuple(skipped),
            plan_seconds=planned.seconds if ahead and planned else self._last_plan_s,
            planned_ahead=ahead,
        )

    # -- retries and narrowing ------------------------------------------------------

    def _apply_or_narrow(
        self,
        first_seq: int,
        entries: Sequence[AnyEntry],
        incarnation: str,
        failure: ApplyError | None,
        planned: Planned | None = None,
    ) -> tuple[int, int, list[int]]:
        """Apply, or (on a persistent failure) apply all but the failing entry.

        ``planned``: the whole batch's plan, made ahead (the halves plan again).
        Returns (row changes, target rows written, skipped seqs).
        """
        if failure is None:
            try:
                rows, written = self._apply_retrying(first_seq, entries, incarnation, planned)
                return rows, written, []
            except (GapError, TransientError):
                raise
            except ApplyError as exc:
                failure = exc
        if len(entries) == 1:
            self._poison(first_seq, entries[0], incarnation, failure)
            return 0, 0, [first_seq]
        half = len(entries) // 2
        r1, w1, s1 = self._apply_or_narrow(first_seq, entries[:half], incarnation, None)
        r2, w2, s2 = self._apply_or_narrow(first_seq + half, entries[half:], incarnation, None)
        return r1 + r2, w1 + w2, s1 + s2

    def _retrying(self, what: Callable[[], Any]) -> Any:
        opts = self.options
        for attempt in range(1, opts.retries + 1):
            try:
                return what()
            except TransientError:
                self._state = None  # the target may have moved: reload next time
                if attempt == opts.retries:
                    raise
                self._sleep(min(opts.retry_max_s, opts.retry_initial_s * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

    def _apply_retrying(
        self,
        first_seq: int,
        entries: Sequence[AnyEntry],
        incarnation: str,
        planned: Planned | None = None,
    ) -> tuple[int, int]:
        if planned is not None and planned.steps is not None:
            steps, rows, schemas = planned.steps, planned.rows, planned.schemas
        else:
            schemas = dict(self.state.schemas)
            t0 = time.perf_counter()
            steps, rows = self._plan(first_seq, entries, schemas)
            self._last_plan_s += time.perf_counter() - t0
        last_seq = first_seq + len(entries) - 1

        def write() -> int:
            return self._writer.write(self.subscription, incarnation, first_seq, last_seq, steps)

        try:
            written: int = self._retrying(write)
        except GapError:
            self._state = None  # the target moved under us: reload next time
            raise
        self._state = SubscriptionState(last_seq, incarnation, schemas)
        return rows, written

    def _poison(self, seq: int, entry: AnyEntry, incarnation: str, failure: ApplyError) -> None:
        """Store the failing entry; raise PoisonEntryError unless the policy is skip."""
        skip = self.options.error_policy == "skip"
        error = str(failure)
        payload = entry.SerializeToString()
        self._retrying(
            lambda: self._writer.record_error(
                self.subscription, incarnation, seq, payload, error, skip=skip
            )
        )
        state = self.state
        level = seq if skip else seq - 1
        self._state = SubscriptionState(level, incarnation, state.schemas)
        if not skip:
            raise PoisonEntryError(
                subscription=self.subscription, seq=seq, level=level, error=error, cause=failure
            ) from failure

    def _check(self, state: SubscriptionState, first_seq: int, incarnation: str) -> None:
        if first_seq != state.level + 1:
            raise GapError(
                f"batch starts at seq {first_seq} but the target's level is {state.level}; "
                f"expected seq {state.level + 1}",
                subscription=self.subscription,
                seq=first_seq,
            )
        if not incarnation:
            raise ApplyError("incarnation must not be empty", subscription=self.subscription)
        if state.incarnation and state.incarnation != incarnation:
            raise GapError(
                f"publication incarnation changed from {state.incarnation!r} to "
                f"{incarnation!r}; the subscription must be re-initialised",
                subscription=self.subscription,
                seq=first_seq,
            )

    def _plan(
        self, first_seq: int, entries: Sequence[AnyEntry], schemas: dict[str, pb.TableSchema]
    ) -> tuple[list[Step], int]:
        """Split the batch into steps; ``schemas`` is updated as schema ops pass.

        The ops are read from the serialized entries with numpy (``_walk.py``);
        a batch it does not read, or whose row changes do not fit their schemas
        (an error), takes the Python walk, :meth:`_plan_python`, the reference.
        """
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
        self, first_seq: int, entries: Sequence[AnyEntry], schemas: dict[str, pb.TableSchema]
    ) -> tuple[list[Step], int]:
        """The batch's steps, walking its ops in Python (shadow entries, ``_wire.py``)."""
        plan = _Plan(self, first_seq, entries)
        pos = 0
        rows = 0
        # Row values stay serialized: they are decoded column-wise (_wire.py).
        for i, entry in enumerate(map(shadow, entries)):
            seq = first_seq + i
            for op in entry.ops:
                kind = op.WhichOneof("kind")
                if kind == "row":
                    change = op.row
                    if change.op == _TRUNCATE:
                        self._truncate(plan, change.table, seq, schemas)
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
        self, plan: _Plan, table: str, seq: int, schemas: dict[str, pb.TableSchema]
    ) -> None:
        if table not in schemas:
            raise self._unknown(table, seq)
        plan.flush()
        opts = self.options.tables.get(table)
        plan.steps.append(TruncateStep((opts and opts.target) or table))

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
        self, steps: list[Step | None], plain: list[tuple[int, EventBuffer]], first_seq: int
    ) -> None:
        """Net effect of the plain segments: one Spark job, overlapped with decoding.

        Fewer events than ``options.spark_min_rows``: no job, Arrow's group-by here
        (Spark's fixed cost per job would bound the in-sync lag).  Otherwise the key
        columns are decoded first and handed to Spark in a worker thread; this thread
        decodes the other columns meanwhile, then takes the surviving events by
        position.
        """
        keys = [buf.keys_table() for _, buf in plain]
        events = sum(k.num_rows for k in keys)
        if events < self.options.spark_min_rows and supported(keys):
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
            fresh = np.flatnonzero(born & ~deleted)
            rest = np.flatnonzero(~born & ~deleted)
            shaped = self._shape(buf.schema, first_seq)  # a renamed target table
            steps[n] = RowsStep(
                shaped[0] if shaped else buf.schema,
                survivors.filter(pa.array(deleted)),
                survivors.take(pa.array(np.concatenate([fresh, rest]), pa.int64())),
                fresh=len(fresh),
            )

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

    def __init__(self, applier: Applier, first_seq: int, entries: Sequence[AnyEntry]) -> None:
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
            self.applier._plain_steps(self.steps, self.plain, self.first_seq)
        assert None not in self.steps
        return self.steps  # type: ignore[return-value]
