"""Writes of :class:`PostgresWriter`: a batch, or a group's pieces in one held transaction.

A piece of a group larger than the batch limits (``commit=False``,
subscriber/targets/held.py) runs, like every batch, in ``_run``'s
``conn.transaction()``; the first piece issues a ``BEGIN`` before it, so that
block and every later piece's become savepoints of that one transaction, which
the last piece commits after writing the level.  A held group never uses JDBC
stages (their emptying would roll back with the group, leaving rows to merge
twice).  Any failure closes the connection with the transaction (temporary
stages die with it; the writer makes new ones).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import psycopg
import structlog

from subscriber.apply.errors import GapError, TransientError, WriterError
from subscriber.apply.writer import RowsStep, Step
from subscriber.targets.conflicts import ConflictGuard
from subscriber.targets.held import Held, HeldWrites
from subscriber.targets.metadata import MetadataSql
from subscriber.targets.nodewatch import NodeWatch
from subscriber.targets.postgres._durable import Durable
from subscriber.targets.postgres._pipeline import Guarded, level_guarded, pipelined
from subscriber.targets.postgres._sequences import advance_sequences, carry_positions

__all__ = ["METADATA_SQL", "GroupWrites"]

log = structlog.get_logger("txrepl.subscriber.conflicts")

METADATA_SQL = MetadataSql(
    mark="%({})s", now="now()", lock_suffix=" FOR UPDATE", make_level_row=True
)


class GroupWrites(HeldWrites):
    """``write``, ``write_held`` and ``abandon``; the rest is :class:`PostgresWriter`'s."""

    _held: Held
    _seqs: dict[str, list[tuple[str, str]]]  # owned sequences (_sequences.py)
    # (table, column) -> the source's sequence position, handed by the engine before
    # each write (subscriber/apply/_sequences.py)
    sequence_positions: dict[tuple[str, str], int]
    _lock: threading.Lock
    _conn: psycopg.Connection[Any] | None
    conflicts: ConflictGuard | None
    apply_origin: str  # the node the next batch's changes come from
    small_values: int  # rows steps up to this many values per statement: no staging
    _nodes: NodeWatch  # the target's node (subscriber/targets/nodewatch.py)
    synchronous_commit: str  # "off": batches of rows only commit asynchronously
    _durable: Durable  # the level the target holds durably (_durable.py)

    def write_held(
        self,
        subscription: str,
        incarnation: str,
        first_seq: int,
        last_seq: int,
        steps: Sequence[Step],
        *,
        commit: bool,
        reexecute: bool = False,
    ) -> int:
        """:meth:`write`, or (``commit=False``) a piece of a group left uncommitted
        (subscriber/targets/held.py): pieces run as savepoints of one ``BEGIN``.
        ``reexecute``: a stored, skipped entry (subscriber/targets/metadata.py)."""
        held = self._held
        guards: list[Guarded] = []  # a pipelined batch's level guard (_pipeline.py)

        def statements(cur: psycopg.Cursor[Any]) -> int:
            written = 0
            for n, step in enumerate(steps):
                written += self._step(cur, subscription, step, staged.get(n))
            advance_sequences(
                cur, [s.schema.table for s in steps if isinstance(s, RowsStep)], self._seqs
            )
            carry_positions(cur, self.sequence_positions, self._seqs)
            if commit:
                seqs = (first_seq, last_seq)
                METADATA_SQL.close_batch(cur, subscription, incarnation, seqs, reexecute)
            return written

        def body(cur: psycopg.Cursor[Any], settings: tuple[str, list[str]] = ("", [])) -> int:
            if piped:  # the level checked by the server; one round trip (_pipeline.py)
                batch = (subscription, incarnation, first_seq)
                # nodeless: the node table must still be absent, else nothing commits
                # (nodewatch.py); settings: folded into the guard (_settings.py)
                nodeless = self._nodes.absent
                guards.append(
                    level_guarded(cur, METADATA_SQL, batch, nodeless=nodeless, settings=settings)
                )
                return statements(cur)
            if held.open:
                held.check(subscription, first_seq)
            else:
                METADATA_SQL.open_batch(cur, subscription, incarnation, first_seq, reexecute)
                if not reexecute:
                    self._nodes.check(cur, subscription, first_seq)
            return statements(cur)

        with self._lock:
            if not held.open:
                self._republish(subscription, first_seq, before=True)
            grouped = held.open or not commit  # no JDBC stages: emptied by a rollback too
            staged = {} if grouped else self._jdbc_stages(subscription, first_seq, steps)
            direct = not (grouped or reexecute or staged)
            piped: bool | str = direct and pipelined(
                steps, subscription, self.conflicts, self.small_values
            )
            # Queued when nothing in it reads a result first: the owned sequences of
            # every table it writes are known (_queued.py, _sequences.py).
            tables = [s.schema.table for s in steps if isinstance(s, RowsStep)]
            if piped and all(t in self._seqs for t in [*tables, *self._carried()]):
                piped = "queued"
            # Rows only commit asynchronously; the rest keeps the server's setting.
            rows_only = all(isinstance(step, RowsStep) for step in steps)
            plain = direct and self.conflicts is None
            synchronous = "off" if plain and rows_only and self.synchronous_commit == "off" else ""
            try:
                if grouped and not held.open:
                    self._connection().execute("BEGIN")
                level = last_seq if commit and not grouped else None  # its LSN read after
                written: int = self._run(
                    subscription, first_seq, body, pipelined=piped, synchronous=synchronous,
                    level=level,
                )  # fmt: skip
                if commit and grouped:
                    conn = self._connection()
                    conn.execute("COMMIT")
                    self._durable.read_after_commit(conn, last_seq)
            except psycopg.Error as exc:
                self._rolled_back()
                self._abandon()
                raise self._refused(exc, self._conn, "the group", subscription, first_seq) from exc
            except BaseException as exc:
                self._rolled_back()
                if grouped:
                    self._abandon()
                if guards:
                    self._failed_pipeline(exc, guards[0], subscription, first_seq)
                raise
            if commit:
                held.clear()
                if self.conflicts is not None:
                    self.conflicts.committed()
                self._republish(subscription, first_seq, before=False)
            else:
                held.hold(subscription, last_seq)
            return written

    def _carried(self) -> list[str]:
        """The tables whose sequences the next write moves to carried positions."""
        return [table for table, _ in self.sequence_positions]

    def _failed_pipeline(
        self, exc: BaseException, guard: Guarded, subscription: str, seq: int
    ) -> None:
        """After a pipelined batch failed: if its level guard is what failed, never a
        row error (``_pipeline.py``): :class:`GapError` if the level read back is not
        the one the batch follows, :class:`NodeAppeared` if the node table appeared,
        else a :class:`GapError` saying the level row changed (else the caller raises
        ``exc``); the connection is closed either way: psycopg counts a statement it
        prepared in the failed pipeline as prepared though the server skipped it
        ("prepared statement ... does not exist" in the next batch)."""
        try:
            if not (isinstance(exc, WriterError) and guard.failed(exc.__cause__)):
                return
            try:
                conn = self._connection()
                guard.check(conn)  # GapError when the batch does not follow the level
            except psycopg.Error as read:  # retried: never the row error of ``exc``
                raise TransientError(
                    f"the level could not be read after the batch's level check failed: {read}",
                    subscription=subscription,
                    seq=seq,
                ) from read
            with contextlib.suppress(psycopg.Error):  # NodeAppeared, if it is that
                self._nodes.check(conn, subscription, seq)
            raise GapError(
                "the level row changed while the batch waited for it",
                subscription=subscription,
                seq=seq,
            ) from exc
        finally:
            if self._conn is not None:
                self._conn.close()

    def _republish(self, subscription: str, seq: int, *, before: bool) -> None:
        """Write the rows a committed batch republished, in a transaction with no
        replication origin (subscriber/targets/conflicts/_republish.py).  After a
        batch's commit a failure leaves them for the next batch, which tries first
        (``before``) and fails, to be retried, if it cannot."""
        guard = self.conflicts
        if guard is None or not guard.republish_due:
            return
        saved, self.apply_origin = self.apply_origin, ""
        try:
            n = self._run(subscription, seq, guard.drain_republished)
            guard.republish_due = False
            if n:
                log.info("republished", subscription=subscription, rows=n)
        except WriterError as exc:  # TransientError too
            if before:
                raise
            log.warning("republish left for the next batch", subscription=subscription,
                        error=str(exc))  # fmt: skip
        finally:
            self.apply_origin = saved

    def abandon(self) -> None:
        """Roll back a group's held transaction, if one is open."""
        with self._lock:
            if self._held.open:
                self._rolled_back()
                self._abandon()

    def _rolled_back(self) -> None:
        if self.conflicts is not None:
            self.conflicts.rolled_back()

    def _abandon(self) -> None:
        # The connection goes with the transaction: its temporary stages may be gone.
        self._held.clear()
        if self._conn is not None:
            self._conn.close()

    # -- provided by PostgresWriter ------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        raise NotImplementedError

    def _run(
        self,
        subscription: str,
        seq: int | None,
        body: Any,
        *,
        pipelined: bool | str = False,
        synchronous: str = "",
        level: int | None = None,
    ) -> Any:
        raise NotImplementedError

    def _refused(
        self,
        exc: psycopg.Error,
        conn: psycopg.Connection[Any] | None,
        what: str,
        subscription: str,
        seq: int | None,
    ) -> WriterError:
        raise NotImplementedError

    def _jdbc_stages(
        self, subscription: str, first_seq: int, steps: Sequence[Step]
    ) -> dict[int, tuple[str | None, str | None]]:
        raise NotImplementedError

    def _step(
        self,
        cur: psycopg.Cursor[Any],
        subscription: str,
        step: Step,
        staged: tuple[str | None, str | None] | None = None,
    ) -> int:
        raise NotImplementedError
