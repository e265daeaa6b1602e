"""Conflict detection and resolution of updatable subscriptions, through the Applier
into real SQLite and PostgreSQL targets whose rows were changed locally."""

from __future__ import annotations

import decimal
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, PoisonEntryError
from subscriber.config import ApplyConfig, SubscriptionConfig
from subscriber.targets import attach_conflicts, updatable_options
from tests.support.backends import Backend, make_backend
from tests.support.entries import INC, ITEMS, dele, ins, schema_op, upd

pytestmark = pytest.mark.spark

D = decimal.Decimal


def _entry(*ops: pb.Op, at_us: int = 1) -> pb.Entry:
    return pb.Entry(commit_time_us=at_us, source_position="p", ops=list(ops))


class Target:
    """An Applier on ``backend`` for subscription ``sub``, updatable with ``resolver``."""

    def __init__(self, spark: Any, backend: Backend, resolver: str, **more: Any) -> None:
        self.backend = backend
        self.writer = backend.make()
        config = SubscriptionConfig(
            publisher="p", address="127.0.0.1:1", publication="pub", name="sub",
            conflicts=resolver, **more,
        )  # fmt: skip
        attach_conflicts(self.writer, [config])
        self.applier = Applier(spark, self.writer, subscription="sub")
        self.applier.configure(updatable_options(ApplyConfig(), config))
        self.seq = 0

    def apply(self, *entries: pb.Entry) -> None:
        self.applier.apply(self.seq + 1, list(entries), incarnation=INC)
        self.seq += len(entries)

    def local(self, sql: str) -> None:
        self.backend.execute(sql)

    def conflicts(self) -> list[dict[str, Any]]:
        rows = self.backend.query(
            "SELECT kind, decision, row_key, publisher_row, local_row, applied_row "
            "FROM txrepl_conflicts ORDER BY id"
        )
        names = ("kind", "decision", "key", "publisher", "local", "applied")
        out = []
        for r in rows:
            d = dict(zip(names, r, strict=True))
            for k in ("key", "publisher", "local", "applied"):
                d[k] = None if d[k] is None else json.loads(d[k])
            out.append(d)
        return out

    def items(self) -> list[tuple[Any, ...]]:
        return self.backend.query("SELECT id, name, price FROM items ORDER BY id")

    def close(self) -> None:
        self.writer.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The targets conflict detection runs on (a MariaDB one is refused at start)."""
    return make_backend(request.param, request, tmp_path)


@pytest.fixture
def seeded(spark: Any, backend: Backend, request: pytest.FixtureRequest) -> Iterator[Target]:
    """Rows 1-5 replicated, then changed on the target: 1 updated, 2 and 3 deleted,
    4 updated, 10 inserted."""
    resolver, more = getattr(request, "param", ("publisher_wins", {}))
    t = Target(spark, backend, resolver, **more)
    t.apply(
        _entry(
            schema_op(ITEMS),
            *[ins("items", i, f"r{i}", D("1.00")) for i in range(1, 6)],
        )
    )
    t.local(
        "UPDATE items SET name = 'local1' WHERE id = 1; DELETE FROM items WHERE id IN (2, 3);"
        "UPDATE items SET name = 'local4' WHERE id = 4;"
        "INSERT INTO items VALUES (10, 'local10', '9.00')"
    )
    yield t
    t.close()


def _publisher_changes(t: Target, at_us: int = 1) -> None:
    t.apply(
        _entry(
            ins("items", 10, "pub10", D("2.00")),  # insert_exists
            upd("items", (1,), 1, "pub1", D("2.00")),  # update_changed
            upd("items", (2,), 2, "pub2", D("2.00")),  # update_missing
            dele("items", 3),  # delete_missing
            dele("items", 4),  # delete_changed
            upd("items", (5,), 5, "pub5", D("2.00")),  # no conflict: unchanged here
            at_us=at_us,
        )
    )


KINDS = {
    1: "update_changed",
    2: "update_missing",
    3: "delete_missing",
    4: "delete_changed",
    10: "insert_exists",
}


def _by_key(conflicts: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {c["key"]["id"]: c for c in conflicts}


def test_each_kind_detected_publisher_wins(seeded: Target) -> None:
    """Every kind of conflict is detected and logged with both rows; the publisher's
    changes win, and a row changed only by the publisher is no conflict."""
    _publisher_changes(seeded)
    got = _by_key(seeded.conflicts())
    assert {k: c["kind"] for k, c in got.items()} == KINDS
    assert {c["decision"] for c in got.values()} == {"take_publisher"}
    assert got[1]["local"]["name"] == "local1"
    assert got[1]["publisher"]["name"] == "pub1"
    assert got[10]["local"]["name"] == "local10"  # the losing row, kept
    assert got[3]["local"] is None
    assert got[3]["publisher"] is None
    assert seeded.items() == [
        (1, "pub1", "2.00"),
        (2, "pub2", "2.00"),
        (5, "pub5", "2.00"),
        (10, "pub10", "2.00"),
    ]
    # A resolved row is replicated again: its next change is no conflict.
    seeded.apply(_entry(upd("items", (1,), 1, "pub1b", D("3.00"))))
    assert len(seeded.conflicts()) == 5


@pytest.mark.parametrize("seeded", [("subscriber_wins", {})], indirect=True)
def test_subscriber_wins_keeps_the_target_rows(seeded: Target) -> None:
    """subscriber_wins: the target's rows stay, the publisher's changes are logged."""
    _publisher_changes(seeded)
    got = _by_key(seeded.conflicts())
    assert {k: c["kind"] for k, c in got.items()} == KINDS
    assert {c["decision"] for c in got.values()} == {"ignore"}
    assert got[10]["publisher"]["name"] == "pub10"  # the losing row, kept
    assert seeded.items() == [
        (1, "local1", "1.00"),
        (4, "local4", "1.00"),
        (5, "pub5", "2.00"),
        (10, "local10", "9.00"),
    ]


def test_detection_off_by_default(spark: Any, backend: Backend) -> None:
    """A subscription that is not updatable upserts as before and logs nothing."""
    t = Target(spark, backend, "")
    t.apply(_entry(schema_op(ITEMS), ins("items", 1, "a", D("1.00"))))
    t.local("UPDATE items SET name = 'local' WHERE id = 1")
    t.apply(_entry(upd("items", (1,), 1, "b", D("1.00"))))
    assert t.items() == [(1, "b", "1.00")]
    assert not t.backend.query(
        "SELECT 1 FROM information_schema.tables WHERE table_name = 'txrepl_conflicts'"
        if backend.name == "postgresql"
        else "SELECT 1 FROM sqlite_master WHERE name = 'txrepl_conflicts'"
    )
    t.close()


@pytest.mark.parametrize(
    "seeded",
    [("python:tests.support.conflict_resolvers:merge_names", {})],
    indirect=True,
)
def test_python_resolver_changes_the_row(seeded: Target) -> None:
    """A Python resolver's row is applied ("apply"), and is the log's applied row."""
    seeded.apply(_entry(upd("items", (1,), 1, "pub1", D("2.00"))))
    [c] = seeded.conflicts()
    assert (c["kind"], c["decision"]) == ("update_changed", "apply")
    assert c["applied"]["name"] == "pub1+local1"
    assert seeded.items()[0] == (1, "pub1+local1", "2.00")


@pytest.mark.parametrize(
    "seeded",
    [("sql:CASE WHEN loc.price > pub.price THEN 'ignore' ELSE 'take_publisher' END", {})],
    indirect=True,
)
def test_sql_resolver_decides(seeded: Target) -> None:
    """A SQL expression over pub.* and loc.* decides per conflict (ignore here)."""
    seeded.local("UPDATE items SET price = '5.00' WHERE id = 1")
    seeded.apply(
        _entry(
            upd("items", (1,), 1, "pub1", D("2.00")),  # local price 5 > 2: ignore
            upd("items", (4,), 4, "pub4", D("7.00")),  # local price 1 < 7: publisher
        )
    )
    got = _by_key(seeded.conflicts())
    assert (got[1]["decision"], got[4]["decision"]) == ("ignore", "take_publisher")
    assert seeded.items()[:2] == [(1, "local1", "5.00"), (4, "pub4", "7.00")]


def test_latest_commit_wins(spark: Any, backend: Backend) -> None:
    """latest_commit_wins: the later of the publisher's commit time and the target row's
    change time column wins."""
    schema = pb.TableSchema(table="items", columns=list(ITEMS.columns), primary_key=["id"])
    ts = schema.columns.add(name="changed_at", type=pb.COLUMN_TYPE_TIMESTAMP, nullable=True)
    assert ts
    t = Target(spark, backend, "latest_commit_wins", conflict_time_column="changed_at")
    t.apply(
        _entry(
            schema_op(schema),
            ins("items", 1, "a", D("1"), None),
            ins("items", 2, "b", D("1"), None),
        )
    )
    # Both rows changed here at 2026-01-01 12:00 (UTC).
    t.local("UPDATE items SET name = 'local', changed_at = '2026-01-01 12:00:00'")
    noon = 1_767_268_800_000_000
    t.apply(
        _entry(upd("items", (1,), 1, "older", D("1"), None), at_us=noon - 1_000_000),
        _entry(upd("items", (2,), 2, "newer", D("1"), None), at_us=noon + 1_000_000),
    )
    assert [r[1] for r in t.items()] == ["local", "newer"]
    assert [c["decision"] for c in t.conflicts()] == ["ignore", "take_publisher"]
    t.close()


@pytest.mark.parametrize(
    "seeded", [("python:tests.support.conflict_resolvers:republish", {})], indirect=True
)
def test_republish_writes_as_a_local_change(seeded: Target, backend: Backend) -> None:
    """ "republish" applies the row as a local change: the target's own triggers, which
    replicated changes never fire, see it (a publication of the target captures it)."""
    if backend.name == "sqlite":
        seeded.local(
            "CREATE TABLE seen (id INTEGER); CREATE TRIGGER saw AFTER UPDATE ON items "
            "BEGIN INSERT INTO seen VALUES (new.id); END"
        )
    else:
        seeded.local(
            "CREATE TABLE seen (id bigint); CREATE FUNCTION saw() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN INSERT INTO seen VALUES (new.id); RETURN new; END $$;"
            "CREATE TRIGGER saw AFTER UPDATE ON items FOR EACH ROW EXECUTE FUNCTION saw()"
        )
    seeded.apply(
        _entry(
            upd("items", (1,), 1, "pub1", D("2.00")),  # a conflict: republished
            upd("items", (5,), 5, "pub5", D("2.00")),  # none: replicated as usual
        )
    )
    [c] = seeded.conflicts()
    assert c["decision"] == "republish"
    assert seeded.items()[0] == (1, "pub1", "2.00")
    assert seeded.backend.query("SELECT id FROM seen") == [(1,)]


@pytest.mark.postgres
def test_postgres_republish_left_by_a_failure_is_written_first(
    spark: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """On PostgreSQL a republished row is written in a transaction of its own after the
    batch's (no replication origin: _republish.py).  When that one fails (here the
    target's trigger refuses it; a crash would leave the same), the row waits in
    ``txrepl_republish`` and the next writer writes it before its first batch."""
    backend = make_backend("postgresql", request, tmp_path)
    resolver = "python:tests.support.conflict_resolvers:republish"
    t = Target(spark, backend, resolver)
    t.apply(_entry(schema_op(ITEMS), ins("items", 1, "r1", D("1.00")), ins("items", 2, "r2", 1)))
    t.local(
        "UPDATE items SET name = 'local1' WHERE id = 1;"
        "CREATE TABLE refuse (on_ boolean); INSERT INTO refuse VALUES (true);"
        "CREATE FUNCTION no() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF (SELECT bool_or(on_) FROM refuse) THEN RAISE EXCEPTION 'refused'; END IF; "
        "RETURN new; END $$;"
        "CREATE TRIGGER no BEFORE UPDATE ON items FOR EACH ROW EXECUTE FUNCTION no()"
    )
    t.apply(_entry(upd("items", (1,), 1, "pub1", D("2.00"))))  # committed, not republished
    assert [c["decision"] for c in t.conflicts()] == ["republish"]
    assert t.items()[0] == (1, "local1", "1.00")
    assert backend.query("SELECT count(*) FROM txrepl_republish") == [(1,)]
    t.close()
    t.local("UPDATE refuse SET on_ = false")
    again = Target(spark, backend, resolver)
    again.seq = t.seq
    again.apply(_entry(upd("items", (2,), 2, "pub2", D("2.00"))))
    assert again.items() == [(1, "pub1", "2.00"), (2, "pub2", "2.00")]
    assert backend.query("SELECT count(*) FROM txrepl_republish") == [(0,)]
    # The republished row is the key's version: the publisher's next change applies.
    again.apply(_entry(upd("items", (1,), 1, "pub1b", D("3.00"))))
    assert again.items()[0] == (1, "pub1b", "3.00")
    assert len(again.conflicts()) == 1
    again.close()


def test_unique_collision(spark: Any, backend: Backend) -> None:
    """A publisher's row taking the unique value of another target row: the other row
    goes (publisher wins) and is kept in the log."""
    t = Target(spark, backend, "publisher_wins")
    t.apply(_entry(schema_op(ITEMS), ins("items", 1, "a", D("1.00"))))
    t.local("CREATE UNIQUE INDEX one_name ON items (name); INSERT INTO items VALUES (20, 'dup', 1)")
    t.apply(_entry(ins("items", 21, "dup", D("2.00"))))
    [c] = t.conflicts()
    assert c["kind"] == "unique_collision"
    assert c["local"]["id"] == 20
    assert c["publisher"]["id"] == 21
    assert t.items() == [(1, "a", "1.00"), (21, "dup", "2.00")]
    t.close()


@pytest.mark.parametrize("resolver", ["publisher_wins", "subscriber_wins"])
def test_seeded_random_workload_converges(spark: Any, backend: Backend, resolver: str) -> None:
    """Random local and publisher changes over several batches (seed 24): the target
    ends as the resolver defines, with every conflict of the reference in the log."""
    rng = random.Random(24)
    t = Target(spark, backend, resolver)
    source: dict[int, str] = {}
    target: dict[int, str] = {}
    dirty: set[int] = set()  # changed here since last replicated
    expected: list[tuple[int, str]] = []
    t.apply(_entry(schema_op(ITEMS)))
    for batch in range(6):
        if batch:  # local changes
            stmts = []
            for k in rng.sample(range(30), 6):
                if k in target and rng.random() < 0.3:
                    stmts.append(f"DELETE FROM items WHERE id = {k}")
                    del target[k]
                else:
                    name = f"l{batch}.{k}"
                    stmts.append(
                        f"INSERT INTO items VALUES ({k}, '{name}', 0) "
                        f"ON CONFLICT (id) DO UPDATE SET name = '{name}'"
                    )
                    target[k] = name
                dirty.add(k)
            t.local(";".join(stmts))
        ops = []
        for k in rng.sample(range(30), 12):  # one change per key and batch
            name = f"p{batch}.{k}"
            if k not in source:
                ops.append(ins("items", k, name, D("0")))
                kind = "insert_exists" if k in target else None
                source[k] = name
            elif rng.random() < 0.3:
                ops.append(dele("items", k))
                kind = (
                    "delete_missing"
                    if k not in target
                    else ("delete_changed" if k in dirty else None)
                )
                del source[k]
            else:
                ops.append(upd("items", (k,), k, name, D("0")))
                kind = (
                    "update_missing"
                    if k not in target
                    else ("update_changed" if k in dirty else None)
                )
                source[k] = name
            if kind:
                expected.append((k, kind))
            if kind and resolver == "subscriber_wins":
                pass  # the target's row (or its absence) stays
            elif k in source:
                target[k] = source[k]
            else:
                target.pop(k, None)
            dirty.discard(k)
        t.apply(_entry(*ops))
    assert [(r[0], r[1]) for r in t.items()] == sorted(target.items())
    got = sorted((c["key"]["id"], c["kind"]) for c in t.conflicts())
    assert got == sorted(expected)
    assert len(got) > 10
    t.close()


@pytest.mark.parametrize(
    "seeded", [("python:tests.support.conflict_resolvers:bad_decision", {})], indirect=True
)
def test_a_failing_resolver_refuses_the_batch(seeded: Target) -> None:
    """A user resolver answering no decision refuses the batch, naming itself and the
    key, and changes nothing (the level stays)."""
    with pytest.raises(PoisonEntryError) as err:
        seeded.apply(_entry(upd("items", (1,), 1, "pub1", D("2.00"))))
    assert "bad_decision" in str(err.value.cause)
    assert '{"id": 1}' in str(err.value.cause)
    assert seeded.items()[0] == (1, "local1", "1.00")
    assert seeded.applier.load_state().level == 1
