"""Errors while applying: transient retries, narrowing to the poisoned entry, skip, retry.

Runs on every backend (the contract suite's ``backend`` fixture).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import (
    Applier,
    ApplyError,
    ApplyOptions,
    PoisonEntryError,
    TransientError,
    Writer,
)
from subscriber.apply.stored import list_errors, retry_error, skip_error
from subscriber.apply.writer import Step
from tests.support.backends import Backend
from tests.support.entries import INC, ITEMS, entry, ins, schema_op, upd

pytestmark = pytest.mark.spark


class Flaky:
    """A writer whose first ``failures`` writes raise TransientError (connection lost)."""

    def __init__(self, inner: Writer, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.dialect = inner.dialect

    def write(
        self,
        subscription: str,
        incarnation: str,
        first: int,
        last: int,
        steps: Sequence[Step],
        *,
        reexecute: bool = False,
    ) -> int:
        if self.failures:
            self.failures -= 1
            raise TransientError("connection lost (injected)", subscription=subscription)
        return self.inner.write(subscription, incarnation, first, last, steps, reexecute=reexecute)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def writer(backend: Backend) -> Iterator[Writer]:
    w = backend.make()
    yield w
    w.close()


def poisoned_stream() -> list[pb.Entry]:
    """Seqs 1..10: schema, then one row per entry; seq 6 breaks the CHECK (name <> 'bad')."""
    out = [entry(schema_op(ITEMS))]
    for k in range(1, 10):
        out.append(entry(ins("items", k, "bad" if k == 5 else f"n{k}", None)))
    return out


def add_check(backend: Backend) -> None:
    if backend.name == "sqlite":  # SQLite cannot add a CHECK: a trigger does the same
        backend.execute(
            "CREATE TRIGGER no_bad BEFORE INSERT ON items WHEN NEW.name = 'bad'"
            " BEGIN /* txrepl:always (a CHECK fires for replicated rows too) */"
            " SELECT RAISE(ABORT, 'CHECK constraint failed: no_bad'); END;"
        )
    else:
        backend.execute("ALTER TABLE items ADD CONSTRAINT no_bad CHECK (name <> 'bad')")


def drop_check(backend: Backend) -> None:
    if backend.name == "sqlite":
        backend.execute("DROP TRIGGER no_bad")
    else:
        backend.execute("ALTER TABLE items DROP CONSTRAINT no_bad")


def test_transient_errors_are_retried(spark: Any, writer: Writer, backend: Backend) -> None:
    """Two injected connection losses are retried with backoff; the batch then commits."""
    sleeps: list[float] = []
    flaky = Flaky(writer, failures=2)
    applier = Applier(spark, flaky, "sub", sleep=sleeps.append)
    res = applier.apply(1, [entry(schema_op(ITEMS), ins("items", 1, "a", None))], incarnation=INC)
    assert res.level == 1
    assert sleeps == [0.2, 0.4]
    flaky.failures = 10
    with pytest.raises(TransientError):
        applier.apply(2, [entry(ins("items", 2, "b", None))], incarnation=INC)
    assert len(sleeps) == 2 + 4  # five attempts in all
    assert backend.rows("items") == [(1, "a", None)]


def test_poisoned_entry_stops_after_the_good_prefix(
    spark: Any,
    writer: Writer,
    backend: Backend,
) -> None:
    """The failing entry is stored whole, everything before it applied; retry after a fix."""
    stream = poisoned_stream()
    applier = Applier(spark, writer, "sub")
    applier.apply(1, stream[:1], incarnation=INC)
    add_check(backend)
    with pytest.raises(PoisonEntryError) as info:
        applier.apply(2, stream[1:], incarnation=INC)
    assert (info.value.seq, info.value.level) == (6, 5)
    assert applier.load_state().level == 5
    assert backend.rows("items") == [(k, f"n{k}", None) for k in range(1, 5)]
    [stored] = list_errors(writer)
    assert (stored.subscription, stored.seq, stored.status) == ("sub", 6, "open")
    assert pb.Entry.FromString(stored.entry) == stream[5]
    assert "no_bad" in stored.error
    # Retrying before the fix fails again and keeps it stored; after the fix it applies.
    with pytest.raises(PoisonEntryError):
        retry_error(applier, 6)
    drop_check(backend)
    assert retry_error(applier, 6).level == 6
    assert [e.status for e in list_errors(writer, "sub")] == ["applied"]
    applier.apply(7, stream[6:], incarnation=INC)
    assert backend.rows("items") == [(k, "bad" if k == 5 else f"n{k}", None) for k in range(1, 10)]


def test_skip_policy_lets_the_rest_flow(spark: Any, writer: Writer, backend: Backend) -> None:
    """With error_policy=skip the poisoned entry is stored and skipped; the rest applies."""
    stream = poisoned_stream()
    applier = Applier(spark, writer, "sub", options=ApplyOptions(error_policy="skip"))
    applier.apply(1, stream[:1], incarnation=INC)
    add_check(backend)
    # A second poisoned entry (an update to 'bad') late in the batch.
    stream.append(entry(upd("items", (2,), 2, "bad", None)))
    res = applier.apply(2, stream[1:], incarnation=INC)
    assert (res.level, res.skipped) == (11, (6, 11))
    assert backend.rows("items") == [(k, f"n{k}", None) for k in range(1, 10) if k != 5]
    assert [(e.seq, e.status) for e in list_errors(writer)] == [(6, "skipped"), (11, "skipped")]


def test_operator_skip_moves_the_level(spark: Any, writer: Writer, backend: Backend) -> None:
    """After a stop, `skip` moves the level past the stored entry; the stream resumes."""
    stream = poisoned_stream()
    applier = Applier(spark, writer, "sub")
    applier.apply(1, stream[:1], incarnation=INC)
    add_check(backend)
    with pytest.raises(PoisonEntryError):
        applier.apply(2, stream[1:], incarnation=INC)
    assert skip_error(writer, "sub", 6) == 6
    applier.load_state()
    applier.apply(7, stream[6:], incarnation=INC)
    assert [r[0] for r in backend.rows("items")] == [1, 2, 3, 4, 6, 7, 8, 9]


def test_skipped_entry_is_re_executed_after_later_ones(
    spark: Any, writer: Writer, backend: Backend
) -> None:
    """Deferred-error queue: a skipped entry is re-executed once the cause is fixed,
    after the entries behind it were applied; the level stays, the target ends equal
    to the source, and the entry cannot run twice."""
    stream = poisoned_stream()
    applier = Applier(spark, writer, "sub", options=ApplyOptions(error_policy="skip"))
    applier.apply(1, stream[:1], incarnation=INC)
    add_check(backend)
    assert applier.apply(2, stream[1:], incarnation=INC).skipped == (6,)
    assert [r[0] for r in backend.rows("items")] == [1, 2, 3, 4, 6, 7, 8, 9]
    # Before the fix: it fails again, changes nothing, stays skipped.
    with pytest.raises(ApplyError, match="no_bad"):
        retry_error(applier, 6)
    assert [(e.seq, e.status) for e in list_errors(writer)] == [(6, "skipped")]
    drop_check(backend)
    assert retry_error(applier, 6).level == 10
    assert applier.load_state().level == 10
    assert backend.rows("items") == [(k, "bad" if k == 5 else f"n{k}", None) for k in range(1, 10)]
    assert [(e.seq, e.status) for e in list_errors(writer)] == [(6, "applied")]
    with pytest.raises(ApplyError, match="already applied"):
        retry_error(applier, 6)
    # The stream goes on from the unchanged level.
    applier.apply(11, [entry(ins("items", 10, "n10", None))], incarnation=INC)
    assert len(backend.rows("items")) == 10
