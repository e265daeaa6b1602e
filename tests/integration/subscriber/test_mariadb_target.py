"""What a MariaDB target does beyond the writer contract (test_apply_contract.py runs
that on it too): refusals at install naming the column, triggers that can tell
replicated rows, the constraint-safe order under a secondary unique index, foreign
keys not checked, DROP COLUMN following the source, NaN refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, PoisonEntryError, SchemaError, WriterError
from subscriber.targets.mariadb import MariaWriter
from subscriber.targets.mariadb._conn import connect
from tests.support.entries import INC, T, col, dele, entry, ins, schema_op, upd

pytestmark = [pytest.mark.mariadb, pytest.mark.spark]


@pytest.fixture
def applier(spark: Any, maria_db: str) -> Iterator[Applier]:
    writer = MariaWriter(maria_db)
    yield Applier(spark, writer, subscription="sub")
    writer.close()


def _sql(url: str, *statements: str) -> list[tuple[Any, ...]]:
    """Run ``statements`` in a session of the target (outside the apply); the last one's rows."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET @txrepl_applying = NULL")  # a user's session, not the apply's
            for s in statements:
                cur.execute(s)
            rows = list(cur.fetchall())
        conn.commit()
        return rows
    finally:
        conn.close()


def _tables(url: str) -> set[str]:
    return {
        r[0]
        for r in _sql(
            url,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()",
        )
    }


USERS = pb.TableSchema(
    table="users",
    columns=[
        col("id", T.COLUMN_TYPE_INTEGER, nullable=False),
        col("email", T.COLUMN_TYPE_TEXT),
        col("note", T.COLUMN_TYPE_TEXT),
    ],
    primary_key=["id"],
)


@pytest.mark.parametrize(
    ("column", "dialect", "ctype", "says"),
    [
        ("c" * 70, "postgresql", T.COLUMN_TYPE_TEXT, "64 characters"),
        ("anything", "sqlite", T.COLUMN_TYPE_UNSPECIFIED, "without a declared type"),
    ],
    ids=["name-too-long", "sqlite-untyped"],
)
def test_unmappable_column_is_refused_at_install_naming_it(
    applier: Applier, maria_db: str, column: str, dialect: str, ctype: int, says: str
) -> None:
    """A column MariaDB cannot hold stops the subscription at the table's first schema
    op with one line naming table and column; the entry is stored, nothing is created."""
    bad = pb.TableSchema(
        table="wide",
        columns=[col("id", T.COLUMN_TYPE_INTEGER, nullable=False), col(column, ctype)],
        primary_key=["id"],
        source_dialect=dialect,
    )
    with pytest.raises(PoisonEntryError) as info:
        applier.apply(1, [entry(schema_op(bad), ins("wide", 1, "x"))], incarnation=INC)
    assert isinstance(info.value.cause, SchemaError)
    message = str(info.value)
    assert f"table 'wide', column {column!r}" in message
    assert says in message
    assert "Traceback" not in message
    [stored] = applier.writer.list_errors("sub")
    assert column in stored.error
    assert "wide" not in _tables(maria_db)
    assert applier.load_state().level == 0


def test_triggers_can_tell_replicated_rows_by_txrepl_applying(
    applier: Applier, maria_db: str
) -> None:
    """MariaDB has no replica role: a trigger guarded by ``@txrepl_applying IS NULL``
    skips replicated rows and still fires for the application's own writes."""
    applier.apply(1, [entry(schema_op(USERS))], incarnation=INC)
    _sql(
        maria_db,
        "CREATE TABLE audit (id BIGINT, what VARCHAR(20))",
        "CREATE TRIGGER users_audit AFTER INSERT ON users FOR EACH ROW"
        " IF @txrepl_applying IS NULL THEN INSERT INTO audit VALUES (NEW.id, 'local'); END IF",
    )
    applier.apply(
        2, [entry(ins("users", 1, "a@x", None), ins("users", 2, "b@x", None))], incarnation=INC
    )
    assert _sql(maria_db, "SELECT * FROM audit") == []
    _sql(maria_db, "INSERT INTO users VALUES (99, 'local@x', NULL)")
    assert _sql(maria_db, "SELECT * FROM audit") == [(99, "local")]


def test_swap_under_a_secondary_unique_index(applier: Applier, maria_db: str) -> None:
    """Two users swap emails through a temporary value in one transaction; with a UNIQUE
    index on the target the rows still land right (delete-then-insert order), where a
    plain ON DUPLICATE KEY UPDATE would have overwritten the other row."""
    applier.apply(
        1,
        [entry(schema_op(USERS), ins("users", 1, "a@x", "one"), ins("users", 2, "b@x", "two"))],
        incarnation=INC,
    )
    _sql(maria_db, "CREATE UNIQUE INDEX users_email ON users (email)")
    applier.apply(
        2,
        [  # one source transaction: narrowing cannot split it
            entry(
                upd("users", (1,), 1, "tmp", "one"),
                upd("users", (2,), 2, "a@x", "two"),
                upd("users", (1,), 1, "b@x", "one"),
            )
        ],
        incarnation=INC,
    )
    assert _sql(maria_db, "SELECT id, email, note FROM users ORDER BY id") == [
        (1, "b@x", "one"),
        (2, "a@x", "two"),
    ]


def test_foreign_keys_are_not_checked(applier: Applier, maria_db: str) -> None:
    """A parent deleted before its child's delete arrives (the source's cascade comes
    as rows) is applied: the apply session runs with foreign_key_checks = 0."""
    child = pb.TableSchema(
        table="child",
        columns=[
            col("id", T.COLUMN_TYPE_INTEGER, nullable=False),
            col("parent", T.COLUMN_TYPE_INTEGER),
        ],
        primary_key=["id"],
    )
    applier.apply(
        1,
        [entry(schema_op(USERS), schema_op(child), ins("users", 1, "a", None), ins("child", 7, 1))],
        incarnation=INC,
    )
    _sql(maria_db, "ALTER TABLE child ADD FOREIGN KEY (parent) REFERENCES users (id)")
    applier.apply(2, [entry(dele("users", 1))], incarnation=INC)
    applier.apply(3, [entry(dele("child", 7))], incarnation=INC)
    assert _sql(maria_db, "SELECT count(*) FROM users") == [(0,)]


def test_drop_column_follows_the_source(applier: Applier, maria_db: str) -> None:
    """A schema op without a column drops it on the target, after the batch's commit;
    the rows before and after the change land right."""
    narrow = pb.TableSchema()
    narrow.CopyFrom(USERS)
    del narrow.columns[2]
    applier.apply(
        1,
        [
            entry(schema_op(USERS), ins("users", 1, "a", "n1")),
            entry(schema_op(narrow), ins("users", 2, "b")),
            entry(upd("users", (1,), 1, "a2")),
        ],
        incarnation=INC,
    )
    cols = _sql(
        maria_db,
        "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE()"
        " AND table_name = 'users' ORDER BY ordinal_position",
    )
    assert [c[0] for c in cols] == ["id", "email"]
    assert _sql(maria_db, "SELECT * FROM users ORDER BY id") == [(1, "a2"), (2, "b")]
    assert applier.load_state().schemas["users"] == narrow


def test_nan_is_refused_naming_the_column(applier: Applier, maria_db: str) -> None:
    """A DOUBLE column cannot hold NaN: the entry stops with the column named."""
    floats = pb.TableSchema(
        table="f",
        columns=[col("id", T.COLUMN_TYPE_INTEGER, nullable=False), col("v", T.COLUMN_TYPE_FLOAT)],
        primary_key=["id"],
    )
    applier.apply(1, [entry(schema_op(floats), ins("f", 1, 1.5))], incarnation=INC)
    with pytest.raises(PoisonEntryError, match="column 'v'") as info:
        applier.apply(2, [entry(ins("f", 2, float("nan")))], incarnation=INC)
    assert isinstance(info.value.cause, WriterError)
    assert _sql(maria_db, "SELECT * FROM f") == [(1, 1.5)]


def test_a_group_held_across_pieces_commits_once(applier: Applier, maria_db: str) -> None:
    """Pieces of one large source transaction (issue 21) go into one MariaDB
    transaction: nothing shows until the last; an abandoned group leaves nothing; a
    schema change in a later piece is refused with one line (its DDL would commit)."""
    applier.apply(1, [entry(schema_op(USERS))], incarnation=INC)
    applier.apply(2, [entry(ins("users", 1, "a", None))], incarnation=INC, hold=True)
    assert _sql(maria_db, "SELECT count(*) FROM users") == [(0,)]
    applier.apply(3, [entry(ins("users", 2, "b", None))], incarnation=INC)
    assert _sql(maria_db, "SELECT id FROM users ORDER BY id") == [(1,), (2,)]
    assert _sql(maria_db, "SELECT level FROM txrepl_subscriptions") == [(3,)]

    applier.apply(4, [entry(ins("users", 3, "c", None))], incarnation=INC, hold=True)
    applier.abandon()
    assert _sql(maria_db, "SELECT count(*) FROM users") == [(2,)]
    wider = pb.TableSchema()
    wider.CopyFrom(USERS)
    wider.columns.append(col("age", T.COLUMN_TYPE_INTEGER))
    applier.apply(4, [entry(ins("users", 3, "c", None))], incarnation=INC, hold=True)
    with pytest.raises(WriterError, match=r"DDL implicitly.*raise \[batch\]"):
        applier.apply(5, [entry(schema_op(wider), ins("users", 4, "d", None, 9))], incarnation=INC)
    assert _sql(maria_db, "SELECT count(*) FROM users") == [(2,)]
    assert applier.load_state().level == 3


def test_a_drop_owed_by_a_crash_is_done_at_the_next_start(applier: Applier, maria_db: str) -> None:
    """A crash between a batch's commit and its DROP COLUMN leaves the drop recorded in
    ``txrepl_pending_drops`` (written with the level): the next writer drops the column."""
    applier.apply(1, [entry(schema_op(USERS), ins("users", 1, "a", "n"))], incarnation=INC)
    # What the committed transaction of such a batch leaves when the process dies
    # before the DROP (the column still there, its drop owed):
    _sql(maria_db, "INSERT INTO txrepl_pending_drops VALUES ('users', 'note')")
    MariaWriter(maria_db).close()
    cols = _sql(
        maria_db,
        "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE()"
        " AND table_name = 'users' ORDER BY ordinal_position",
    )
    assert [c[0] for c in cols] == ["id", "email"]
    assert _sql(maria_db, "SELECT count(*) FROM txrepl_pending_drops") == [(0,)]


def test_a_lost_connection_is_retried_on_a_new_one(applier: Applier, maria_db: str) -> None:
    """The server drops the writer's connection between two batches (a restart, a
    proxy's timeout): the next batch is retried on a new connection and applies."""
    applier.apply(1, [entry(schema_op(USERS), ins("users", 1, "a", None))], incarnation=INC)
    for (pid,) in _sql(
        maria_db,
        "SELECT id FROM information_schema.processlist WHERE db = DATABASE()"
        " AND id <> connection_id()",
    ):
        _sql(maria_db, f"KILL {int(pid)}")
    applier.apply(2, [entry(ins("users", 2, "b", None))], incarnation=INC)
    assert _sql(maria_db, "SELECT id FROM users ORDER BY id") == [(1,), (2,)]
    assert applier.load_state().level == 2
