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
   whole row, a delete removes it), and events of different keys commute as
   far as the final state goes.  They do not commute for the constraints a
   target checks row by row (a unique email swapped through a temporary value):
   the rows steps of a table holding a unique or exclusion constraint are
   written as "delete every touched key, then insert" (``_order.py``, with the
   argument for foreign keys and CHECK constraints too).
   Barriers are never reordered with the rows around them.
4. **Write.**  The writer runs, in ONE target transaction: re-read the level row
   under the target's write lock and refuse unless ``level + 1 == first_seq`` (and
   the incarnation matches), then each step in order (DDL, deletes, then upserts
   per table segment), then the new level row (``level = first_seq + n - 1``),
   then commit.

Errors: a :class:`TransientError` of the writer (connection lost, lock timeout,
serialization failure) is retried with exponential backoff
(``options.retry_backoff``, a :class:`common.backoff.Backoff`), up to
``options.retries`` attempts. Spark's own errors are translated at one boundary
(``_spark.py``) into :class:`SparkError`, which is not an :class:`ApplyError`: the
batch is neither narrowed nor stored, the subscription tries it again. Any other
:class:`ApplyError` (a constraint, bad data, a schema problem) is *narrowed*: the
batch is split in halves, recursively, each half applied on its own (committing the
good ones and moving the level), until the failing entry is alone. That entry is
stored whole in ``txrepl_errors`` (in a transaction that checks the level is just
before it); then, by ``error_policy``, either :class:`PoisonEntryError` is raised
(``stop``, the default: the level stays just before the entry) or the level moves
past it and the rest of the batch is applied (``skip``). Cost of narrowing: about
``2 log2(n)`` applies for a batch of ``n`` entries, only on failure.

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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import structlog

from common.rpc import txrepl_pb2 as pb
from subscriber.apply._events import net_effect_positions
from subscriber.apply._order import ConstraintOrder
from subscriber.apply._origin import by_origin
from subscriber.apply._pieces import Pieces
from subscriber.apply._plan import Planning
from subscriber.apply._sequences import hand_positions
from subscriber.apply.entry import AnyEntry, group_half
from subscriber.apply.errors import (
    ApplyError,
    GapError,
    NodeAppeared,
    PoisonEntryError,
    TransientError,
)
from subscriber.apply.lazy import LazySpark
from subscriber.apply.options import ApplyOptions
from subscriber.apply.writer import Step, SubscriptionState, Writer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Applier", "ApplyResult", "Planned", "warm_up", "warm_up_awhile"]


# The JVM compiles the job's code over its first runs: measured on 2 cores, a 72k-key
# job cost the JVM 0.67, 0.62, 0.43, 0.39 s of CPU in runs 2-5, then ~0.3 s.  Three
# runs at start-up (about 1 s) take most of that off the first batches of a catch-up.
WARM_UP_JOBS = 3


def warm_up(spark: SparkSession, jobs: int = WARM_UP_JOBS) -> SparkSession:
    """Run a net-effect job of the common shape (one BIGINT key, 50k rows) ``jobs``
    times, so that the JVM has loaded and compiled that path before a catch-up's
    first batch (measured: the first W1 catch-up batch took 6 s against 0.6-0.9 s for
    the next ones when the job only started in the background)."""
    n = 50_000
    keys = pa.table(
        {
            "_pos": pa.array(np.arange(n), pa.int64()),
            "c0": pa.array(np.arange(n) % (n // 2), pa.int64()),
        }
    )
    began = time.monotonic()
    for _ in range(jobs):
        net_effect_positions(spark, [keys])
    structlog.get_logger(__name__).info(
        "spark warmed up", seconds=round(time.monotonic() - began, 3)
    )
    return spark


def warm_up_awhile(spark: SparkSession, wait_s: float) -> None:
    """:func:`warm_up` in a thread of its own, waited for at most ``wait_s``: jobs
    still running then (a cluster without executors) go on in the background.  Its
    errors are dropped: a broken Spark shows at its first batch."""

    def jobs() -> None:
        with contextlib.suppress(Exception):
            warm_up(spark)

    warming = threading.Thread(target=jobs, name="txrepl-spark-warm-up", daemon=True)
    warming.start()
    warming.join(wait_s)


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
    node: str = ""  # the target's node it was planned with (own entries left out: _origin.py)


class Applier(Planning, Pieces):
    """Applies the batches of one subscription to one target, through Spark.

    Planning (steps 1-3: walk, events, net effect) is the base :class:`Planning`
    (``_plan.py``); this class writes, retries, narrows and stores poisoned entries.
    """

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
        self._order = ConstraintOrder(writer)  # rows steps under unique constraints
        self._last_plan_s = 0.0
        self._node = ""  # the target's node, once found (_origin.py)
        self.options = ApplyOptions()
        self.configure(options or ApplyOptions())

    @property
    def writer(self) -> Writer:
        return self._writer

    @property
    def spark(self) -> SparkSession:
        return self._spark

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

        The first call on a SparkSession also runs :func:`warm_up` on it, waiting at
        most ``WARM_UP_WAIT_S``; jobs still running then (a cluster without
        executors) go on in the background.  A daemon's session
        (:class:`~subscriber.apply.lazy.LazySpark`) is warmed by its own start
        instead, so this never waits for, nor starts, its JVM.
        """
        self._state = self._writer.load_state(self.subscription)
        self._warm_up()
        return self._state

    WARM_UP_WAIT_S = 60.0

    def _warm_up(self) -> None:
        spark: Any = self._spark
        if isinstance(spark, LazySpark) or getattr(spark, "_txrepl_warm", False):
            return
        spark._txrepl_warm = True
        warm_up_awhile(spark, self.WARM_UP_WAIT_S)

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
        node = self._node  # as apply() last read it; a plan made with another is dropped
        if node:  # as apply() will (_origin.py)
            entries = by_origin(entries, node)[0]
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
        took = time.perf_counter() - started
        return Planned(first_seq, len(entries), base, schemas, steps, rows, took, node=node)

    def apply(
        self,
        first_seq: int,
        entries: Sequence[AnyEntry],
        *,
        incarnation: str,
        planned: Planned | None = None,
        hold: bool = False,
    ) -> ApplyResult:
        """Apply the batch and move the level, in one target transaction.

        ``hold``: the batch is a piece of a group that goes on in the next batch: it
        is written into the group's open target transaction, the level unmoved
        (``_pieces.py``); the batch after it continues (and may end) the group.

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
        try:
            return self._apply_once(first_seq, entries, incarnation, planned, hold)
        except NodeAppeared:  # recorded since the writer found none: plan for it, once
            self._node = ""
            return self._apply_once(first_seq, entries, incarnation, None, hold)

    def _apply_once(
        self,
        first_seq: int,
        entries: Sequence[AnyEntry],
        incarnation: str,
        planned: Planned | None,
        hold: bool,
    ) -> ApplyResult:
        # -- origins (issue 24, _origin.py): skip the target's own, one origin per write --
        if entries and self._target_node():
            entries, runs = by_origin(entries, self._node)
            if len(runs) > 1:
                return self._apply_runs(first_seq, entries, runs, incarnation)
            with contextlib.suppress(AttributeError):  # a writer that keeps no origins
                self._writer.apply_origin = runs[0][2]  # type: ignore[attr-defined]
        # -- groups (issue 21): pieces of a group over the batch limits (_pieces.py) --
        if entries and self._piece_due(first_seq, hold):
            return ApplyResult(*self._apply_piece(first_seq, entries, incarnation, commit=not hold))
        # -- end groups --
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
            and planned.node == self._node
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

    def durable_level(self, applied: int, *, poll: bool = False) -> tuple[int, bool]:
        """(the highest level up to ``applied`` the target holds durably, whether
        committed levels still wait to be): what may be acknowledged.  A writer
        without ``durable_level`` commits durably (subscriber/targets/postgres/
        _durable.py has one that does not)."""
        durable = getattr(self._writer, "durable_level", None)
        return (applied, False) if durable is None else durable(applied, poll=poll)

    # -- origins (_origin.py) ---------------------------------------------------------

    @property
    def target_node(self) -> str:
        """The target's node as last read ("" if none or not read yet); no query."""
        return self._node

    def read_target_node(self) -> str:
        """The target's node, read from the target unless already found."""
        return self._target_node()

    def _target_node(self) -> str:
        """The target's node ("" if it is none), read until found: a publisher may
        record it after this subscription started (common/origin.py)."""
        if not self._node:
            self._node = str(getattr(self._writer, "node", "") or "")
        return self._node

    def _apply_runs(
        self, first_seq: int, entries: Sequence[AnyEntry], runs: Sequence[tuple[int, int, str]],
        incarnation: str,
    ) -> ApplyResult:  # fmt: skip
        """A batch of several origins: one write per run, each with its origin."""
        started = time.perf_counter()
        parts = [  # Applier's own apply: a subclass measures the batch once, not per run
            Applier.apply(self, first_seq + a, entries[a:b], incarnation=incarnation)
            for a, b, _ in runs
        ]
        return ApplyResult(
            parts[-1].level,
            sum(p.rows for p in parts),
            sum(p.written for p in parts),
            len(entries),
            time.perf_counter() - started,
            tuple(s for p in parts for s in p.skipped),
            plan_seconds=sum(p.plan_seconds for p in parts),
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
                self._order.forget()  # a constraint added by hand: read the catalog again
                failure = exc
        # -- groups (issue 21, common/fragments.py S1): halves end at group ends --
        half = group_half(entries)
        if half == 0:  # one group: stored as its first fragment; a group is never skipped
            self._poison(first_seq, entries[0], incarnation, failure, alone=len(entries) == 1)
            return 0, 0, [first_seq]
        # -- end groups --
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
                self._sleep(opts.retry_backoff.delay(attempt, 0.0))
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
            ordered = self._order.steps(steps)  # constraint-safe order (_order.py)
            hand_positions(self._writer, entries)  # sequence positions (_sequences.py)
            return self._writer.write(self.subscription, incarnation, first_seq, last_seq, ordered)

        try:
            written: int = self._retrying(write)
        except GapError:
            self._state = None  # the target moved under us: reload next time
            raise
        self._state = SubscriptionState(last_seq, incarnation, schemas)
        return rows, written

    def _poison(
        self,
        seq: int,
        entry: AnyEntry,
        incarnation: str,
        failure: ApplyError,
        *,
        alone: bool = True,
    ) -> None:
        """Store the failing entry; raise PoisonEntryError unless the policy is skip.

        ``alone=False``: the entry is the first fragment of a failing group, which
        is never skipped (the level would point inside the group).
        """
        skip = self.options.error_policy == "skip" and alone
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
