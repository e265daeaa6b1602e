"""ADD/DROP of constraints and indexes on published tables, end to end, into both targets.

Real daemons (publisher on a real PostgreSQL or SQLite source, a subscriber applying
through Spark into SQLite or PostgreSQL).  A user adds a UNIQUE constraint, a CHECK,
an index and a foreign key to a published table while it is replicated, swaps two
values under the new UNIQUE in one transaction, then drops them: the target carries
what the source has (a foreign key to a table outside the publication left out), with
the subscriber running or started after everything (one batch), across a publisher
restart and a kill -9 of the subscriber during the batch; a constraint the target's
own rows violate stops the subscription naming table and constraint.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import Pair, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

PG_SCHEMA = """
CREATE TABLE outside(id int PRIMARY KEY);
INSERT INTO outside VALUES (1);
CREATE TABLE parent(id int PRIMARY KEY, name text);
INSERT INTO parent SELECT g, 'p' || g FROM generate_series(1, 3) g;
CREATE TABLE items(id int PRIMARY KEY, email text, qty int,
                   pid int CONSTRAINT items_pid_fkey REFERENCES parent(id),
                   oid int CONSTRAINT items_oid_fkey REFERENCES outside(id));
INSERT INTO items SELECT g, 'e' || g, g, 1 + g % 3, 1 FROM generate_series(1, 5) g;
"""

ADD = [
    "ALTER TABLE items ADD CONSTRAINT items_email_key UNIQUE (email)",
    "CREATE INDEX items_qty_idx ON items (qty)",
    "ALTER TABLE items ADD CONSTRAINT items_qty_check CHECK (qty > 0)",
    "ALTER TABLE parent ADD CONSTRAINT parent_name_key UNIQUE (name)",
]
# Two emails swapped in one transaction under the new UNIQUE (the row change that
# makes pgoutput send the relation message), and a write of parent.
SWAP = [
    "UPDATE items SET email = 'tmp' WHERE id = 1",
    "UPDATE items SET email = 'e1' WHERE id = 2",
    "UPDATE items SET email = 'e2' WHERE id = 1",
]
DROP = [
    "ALTER TABLE items DROP CONSTRAINT items_email_key",
    "DROP INDEX items_qty_idx",
    "ALTER TABLE items DROP CONSTRAINT items_qty_check",
]
AFTER_DROP = "UPDATE items SET email = 'e3' WHERE id = 4"  # a duplicate, allowed now


def _pg_source(pg_server: Any) -> tuple[str, psycopg.Connection[Any]]:
    dsn = pg_server.create_database()
    src = psycopg.connect(dsn, autocommit=True)
    src.execute(PG_SCHEMA.encode())
    return dsn, src


def _run(src: Any, statements: list[str], *, one_transaction: bool = False) -> None:
    if isinstance(src, sqlite3.Connection):
        src.executescript("BEGIN;" + ";".join(statements) + ";COMMIT;")
    elif one_transaction:
        with src.transaction():
            for s in statements:
                src.execute(s.encode())
    else:
        for s in statements:
            src.execute(s.encode())


def _target_names(url: str, table: str) -> set[str]:
    """Names of the target table's constraints and indexes (SQLite: its indexes and,
    as ``fk:<parent>``, its foreign keys), primary key and automatic ones left out."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30) as c:
            names = {r[1] for r in c.execute(f"PRAGMA index_list({table})") if r[3] != "pk"}
            names |= {"fk:" + r[2] for r in c.execute(f"PRAGMA foreign_key_list({table})")}
        return names
    with psycopg.connect(url) as c:
        rows = c.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype <> 'p'"
            " UNION SELECT indexrelid::regclass::text FROM pg_index"
            " WHERE indrelid = %s::regclass AND NOT indisprimary",
            (table, table),
        ).fetchall()
    return {str(r[0]) for r in rows}


def _rows(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(sql).fetchall()]


def _wait_target(pair: Pair, src: Any, url: str, table: str, want: set[str]) -> None:
    """The target's ``table`` has exactly the constraints ``want`` and the source's rows."""
    query = f"SELECT * FROM {table} ORDER BY 1"
    seen: list[Any] = []

    def done() -> bool:
        try:
            names = _target_names(url, table)
            if url.startswith("sqlite:///"):
                with sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30) as dst:
                    rows = _rows(dst, query)
            else:
                with psycopg.connect(url) as dst_pg:
                    rows = _rows(dst_pg, query)
        except (sqlite3.Error, psycopg.Error) as exc:
            seen[:] = [str(exc)]
            return False
        seen[:] = [names, rows]
        return names == want and rows == _rows(src, query)

    try:
        wait_until(done, 90, f"the target's {table} to match", interval=0.3)
    except TimeoutError:
        st = pair.status()
        raise AssertionError(f"state {st.state} ({st.last_error}); target: {seen}") from None


# What each target carries after ADD, per (source, target): a SQLite target carries
# UNIQUE constraints and indexes, plus the foreign keys of the tables it creates.
PG_ADDED = {"items_pid_fkey", "items_email_key", "items_qty_idx", "items_qty_check"}
SQLITE_ADDED = {"items_email_key", "items_qty_idx", "fk:parent"}


def _target(kind: str, tmp_path: Path, pg_server: Any) -> str:
    return pg_server.create_database() if kind == "postgres" else f"sqlite:///{tmp_path}/t.db"


def _pg_pair(
    tmp_path: Path, pg_server: Any, kind: str
) -> tuple[psycopg.Connection[Any], str, Pair]:
    """(source connection, target URL, the pair) for a PostgreSQL source publishing
    ``parent`` and ``items`` into a ``kind`` target."""
    dsn, src = _pg_source(pg_server)
    url = _target(kind, tmp_path, pg_server)
    pair = Pair(
        tmp_path,
        tables=["parent", "items"],
        source_url=dsn,
        target_url=url,
        publisher_extra={"slot": "txrepl_" + dsn.rsplit("/", 1)[-1]},
    )
    return src, url, pair


@pytest.mark.parametrize("mode", ["running", "paused"])
@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_constraints_follow_a_postgresql_source(
    tmp_path: Path, pg_server: Any, kind: str, mode: str
) -> None:
    """UNIQUE, CHECK, an index and foreign keys reach the target as the source has them,
    not the foreign key to a table outside the publication; a swap under the new
    UNIQUE applies; dropped ones are dropped and a duplicate then lands."""
    src, url, pair = _pg_pair(tmp_path, pg_server, kind)
    added = PG_ADDED if kind == "postgres" else SQLITE_ADDED
    base = {"items_pid_fkey"} if kind == "postgres" else {"fk:parent"}
    try:
        pair.start_publisher()
        wait_until(lambda: pair.head() > 0, 60, "the install snapshot")
        if mode == "running":
            pair.start_subscriber()
            _wait_target(pair, src, url, "items", base)
        _run(src, ADD)
        _run(src, SWAP, one_transaction=True)
        _run(src, ["UPDATE parent SET name = 'x' WHERE id = 1"])
        if mode == "running":
            _wait_target(pair, src, url, "items", added)
            _wait_target(pair, src, url, "parent", {"parent_name_key"})
        _run(src, DROP)
        _run(src, [AFTER_DROP])
        if mode == "paused":
            pair.start_subscriber()
        _wait_target(pair, src, url, "items", base)
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()
        src.close()


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_constraints_across_a_publisher_restart_and_a_subscriber_kill(
    tmp_path: Path, pg_server: Any, kind: str
) -> None:
    """Constraints added while the publisher is down reach the target after its restart;
    kill -9 of the subscriber while it applies them (one batch) loses nothing."""
    src, url, pair = _pg_pair(tmp_path, pg_server, kind)
    added = PG_ADDED if kind == "postgres" else SQLITE_ADDED
    try:
        pair.start_publisher()
        sub = pair.start_subscriber()
        base = {"items_pid_fkey"} if kind == "postgres" else {"fk:parent"}
        _wait_target(pair, src, url, "items", base)
        assert pair.pub is not None
        listen = "127.0.0.1:" + pair.pub.address.rsplit(":", 1)[1]
        sub.stop()
        pair.pub.stop()
        _run(src, ADD)
        _run(src, SWAP, one_transaction=True)
        pair.start_publisher(listen=listen)
        before = pair.head()
        _run(
            src, ["INSERT INTO items SELECT g, 'm' || g, g, 1, 1 FROM generate_series(10, 2000) g"]
        )
        wait_until(lambda: pair.head() > before, 60, "the rows to be logged")
        sub = pair.start_subscriber()  # one batch: the schema ops, the swap, the rows
        wait_until(lambda: pair.status().state != "connecting", 60, "the subscriber to start")
        sub.kill()
        pair.start_subscriber()
        _wait_target(pair, src, url, "items", added)
        # the killed subscriber may have committed the batch: the target can be complete
        # before its successor has connected
        wait_until(lambda: pair.status().state == "in_sync", 60, "the restarted subscriber in sync")
    finally:
        pair.stop()
        src.close()


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_a_constraint_the_target_rows_violate_is_refused_by_name(
    tmp_path: Path, pg_server: Any, kind: str
) -> None:
    """A UNIQUE constraint whose values a hand-edited target row duplicates stops the
    subscription naming table and constraint, the entry parked in txrepl_errors."""
    src, url, pair = _pg_pair(tmp_path, pg_server, kind)
    try:
        pair.start_publisher()
        pair.start_subscriber()
        base = {"items_pid_fkey"} if kind == "postgres" else {"fk:parent"}
        _wait_target(pair, src, url, "items", base)
        hand = "UPDATE items SET email = 'e1' WHERE id = 2"  # only on the target
        if kind == "postgres":
            with psycopg.connect(url, autocommit=True) as dst:
                dst.execute(hand)
        else:
            with sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30) as dst_l:
                dst_l.execute(hand)
        _run(src, [ADD[0], "UPDATE items SET qty = 9 WHERE id = 5"])
        wait_until(lambda: pair.status().state == "error", 60, "the subscription to stop")
        error = pair.status().last_error
        assert "items_email_key" in error, error
        assert "'items'" in error, error
        if kind == "postgres":
            with psycopg.connect(url) as dst:
                parked = dst.execute("SELECT count(*) FROM txrepl_errors").fetchone()
        else:
            with sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30) as dst_l:
                parked = dst_l.execute("SELECT count(*) FROM txrepl_errors").fetchone()
        assert parked == (1,)
    finally:
        pair.stop()
        src.close()


SQLITE_SCHEMA = """
CREATE TABLE outside(id INTEGER PRIMARY KEY);
CREATE TABLE parent(id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE items(id INTEGER PRIMARY KEY, email TEXT, qty INTEGER,
                   oid INTEGER REFERENCES outside(id),
                   pid INTEGER REFERENCES parent(id) ON DELETE CASCADE);
INSERT INTO outside VALUES (1);
INSERT INTO parent VALUES (1, 'p1'), (2, 'p2');
INSERT INTO items VALUES (1, 'e1', 1, 1, 1), (2, 'e2', 2, 1, 2), (3, 'e3', 3, 1, 1);
"""


def _wait_names(pair: Pair, url: str, table: str, want: set[str]) -> None:
    seen: list[set[str]] = []

    def done() -> bool:
        seen[:] = [_target_names(url, table)]
        return seen[0] == want

    try:
        wait_until(done, 60, f"the target's {table} constraints", interval=0.3)
    except TimeoutError:
        st = pair.status()
        raise AssertionError(f"state {st.state} ({st.last_error}); target has {seen}") from None


@pytest.mark.parametrize("mode", ["running", "paused"])
@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_indexes_follow_a_sqlite_source_without_a_later_write(
    tmp_path: Path, pg_server: Any, kind: str, mode: str
) -> None:
    """A SQLite source's CREATE UNIQUE INDEX and DROP INDEX reach the target with no
    row written after them; its foreign keys reach a table the target creates, not
    the one to a table outside the publication; a swap under the index applies."""
    url = _target(kind, tmp_path, pg_server)
    pair = Pair(tmp_path, tables=["parent", "items"], target_url=url)
    src = sqlite3.connect(str(pair.source_path), isolation_level=None, timeout=30)
    src.execute("PRAGMA journal_mode=WAL")
    src.executescript(SQLITE_SCHEMA)
    fk = {"items_fk0"} if kind == "postgres" else {"fk:parent"}
    try:
        pair.start_publisher()
        if mode == "running":
            pair.start_subscriber()
            _wait_target(pair, src, url, "items", fk)
        src.execute("CREATE UNIQUE INDEX items_email_uq ON items(email)")
        if mode == "running":
            _wait_names(pair, url, "items", fk | {"items_email_uq"})
        _run(src, ["UPDATE items SET email = 'tmp' WHERE id = 1",
                   "UPDATE items SET email = 'e1' WHERE id = 2",
                   "UPDATE items SET email = 'e2' WHERE id = 1"])  # fmt: skip
        if mode == "running":
            _wait_target(pair, src, url, "items", fk | {"items_email_uq"})
        src.execute("DROP INDEX items_email_uq")
        if mode == "paused":
            pair.start_subscriber()
        _wait_target(pair, src, url, "items", fk)
        src.execute("UPDATE items SET email = 'e3' WHERE id = 1")  # a duplicate now
        _wait_target(pair, src, url, "items", fk)
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()
        src.close()


@pytest.mark.parametrize(
    ("kind", "plugin"),
    [("postgres", "pgoutput"), ("sqlite", "pgoutput"), ("sqlite", "wal2json")],
)
def test_postgresql_ddl_with_no_write_after_it(
    tmp_path: Path, pg_server: Any, kind: str, plugin: str
) -> None:
    """A UNIQUE constraint and an ADD COLUMN ... DEFAULT on a PostgreSQL source, with
    no write to the tables afterwards, reach the running target within seconds,
    decoded by either plugin."""
    src, url, pair = _pg_pair(tmp_path, pg_server, kind)
    pair.publisher_extra["plugin"] = plugin
    base = {"items_pid_fkey"} if kind == "postgres" else {"fk:parent"}
    try:
        pair.start_publisher()
        pair.start_subscriber()
        _wait_target(pair, src, url, "items", base)
        _run(src, [ADD[0], "ALTER TABLE parent ADD COLUMN note text DEFAULT 'n'"])
        _wait_target(pair, src, url, "items", base | {"items_email_key"})
        _wait_target(pair, src, url, "parent", set())
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()
        src.close()


REBUILT = """
CREATE TABLE parent(id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE items(id INTEGER PRIMARY KEY, email TEXT, qty INTEGER, pid INTEGER);
INSERT INTO parent VALUES (1, 'p1'), (2, 'p2');
INSERT INTO items VALUES (1, 'e1', 1, 1), (2, 'e2', 2, 2), (3, 'e3', 3, 1);
"""
# The application changes a table's CHECKs and foreign keys the SQLite way: a new
# table, the rows copied, the old one dropped, the new one renamed.
_REBUILD = (
    "BEGIN; CREATE TABLE items_new(id INTEGER PRIMARY KEY, email TEXT, qty INTEGER{check},"
    " pid INTEGER{fk}); INSERT INTO items_new SELECT * FROM items; DROP TABLE items;"
    " ALTER TABLE items_new RENAME TO items; COMMIT;"
)
WITH = _REBUILD.format(
    check=" CONSTRAINT items_qty_check CHECK (qty > 0)",
    fk=" REFERENCES parent(id) ON DELETE CASCADE",
)
WITHOUT = _REBUILD.format(check="", fk="")


def _sqlite_follows(pair: Pair, src: sqlite3.Connection, path: str, carried: bool) -> None:
    """The SQLite target's items has the source's rows, and the CHECK and the foreign
    key when ``carried`` (else neither)."""
    query = "SELECT * FROM items ORDER BY 1"
    seen: list[Any] = []

    def done() -> bool:
        try:
            with sqlite3.connect(path, timeout=30) as dst:
                keys = [
                    (r[2], r[3], r[4], r[6]) for r in dst.execute("PRAGMA foreign_key_list(items)")
                ]
                sql = dst.execute("SELECT sql FROM sqlite_master WHERE name = 'items'").fetchone()
                seen[:] = [keys, sql, _rows(dst, query)]
        except sqlite3.Error as exc:  # no table yet
            seen[:] = [str(exc)]
            return False
        want = [("parent", "pid", "id", "CASCADE")] if carried else []
        has_check = sql is not None and "items_qty_check" in sql[0]
        return keys == want and has_check == carried and seen[2] == _rows(src, query)

    try:
        wait_until(done, 90, "the target's items to match", interval=0.3)
    except TimeoutError:
        st = pair.status()
        raise AssertionError(f"state {st.state} ({st.last_error}); target: {seen}") from None
    dst = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        dst.execute("BEGIN")
        if carried:
            with pytest.raises(sqlite3.IntegrityError, match="items_qty_check"):
                dst.execute("INSERT INTO items VALUES (99, 'x', 0, 1)")
        else:
            dst.execute("INSERT INTO items VALUES (99, 'x', 0, 1)")
    finally:
        dst.execute("ROLLBACK")
        dst.close()


@pytest.mark.parametrize("mode", ["running", "paused"])
def test_a_sqlite_target_follows_checks_and_foreign_keys_of_a_rebuilt_table(
    tmp_path: Path, mode: str
) -> None:
    """A SQLite source table rebuilt with a CHECK and a foreign key, then rebuilt
    without them: the SQLite target's table gains both (a violating row is refused
    by name) and loses them again, with its rows equal to the source's, whether the
    subscriber runs or takes each change in one batch."""
    pair = Pair(tmp_path, tables=["parent", "items"])
    path = str(pair.target_path)
    src = sqlite3.connect(str(pair.source_path), isolation_level=None, timeout=30)
    src.execute("PRAGMA journal_mode=WAL")
    src.executescript(REBUILT)
    try:
        pair.start_publisher()
        wait_until(lambda: pair.head() > 0, 60, "the tables in the log")
        if mode == "running":
            pair.start_subscriber()
            _sqlite_follows(pair, src, path, carried=False)
        head = pair.head()
        src.executescript(WITH)
        src.execute("UPDATE items SET qty = 7 WHERE id = 2")
        if mode == "paused":
            wait_until(lambda: pair.head() > head, 60, "the rebuild in the log")
            pair.start_subscriber()
        _sqlite_follows(pair, src, path, carried=True)
        src.executescript(WITHOUT)
        src.execute("UPDATE items SET qty = 0 WHERE id = 3")  # allowed again
        _sqlite_follows(pair, src, path, carried=False)
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()
        src.close()


_VALIDATED = (
    "SELECT conname, contype, convalidated FROM pg_constraint"
    " WHERE conrelid = 'items'::regclass AND contype IN ('c', 'f', 'x') ORDER BY 1"
)


def test_exclusion_and_not_valid_constraints_follow_a_postgresql_source(
    tmp_path: Path, pg_server: Any
) -> None:
    """An exclusion constraint and foreign keys added NOT VALID over rows that violate
    them reach a PostgreSQL target as the source has them (the exclusion enforced,
    the keys not validated, the rows equal); a CHECK added NOT VALID does not.  The
    source's "fix the rows, then VALIDATE" never stops the subscription, even when
    the schema op is logged before the fixed rows; once the target has the fixed
    rows, a VALIDATE validates its copy."""
    src, url, pair = _pg_pair(tmp_path, pg_server, "postgres")
    base = {"items_pid_fkey"}
    added = base | {"items_during_excl", "items_owner_fkey", "items_buddy_fkey"}

    def validated() -> dict[str, tuple[Any, ...]]:
        with psycopg.connect(url) as dst:
            return {r[0]: r[1:] for r in _rows(dst, _VALIDATED)}

    try:
        pair.start_publisher()
        pair.start_subscriber()
        _wait_target(pair, src, url, "items", base)
        _run(src, [
            "ALTER TABLE items ADD COLUMN during int4range, ADD COLUMN owner int,"
            " ADD COLUMN buddy int",
            "UPDATE items SET during = int4range(id * 10, id * 10 + 5), owner = id, buddy = id",
            "ALTER TABLE items ADD CONSTRAINT items_during_excl"
            " EXCLUDE USING gist (during WITH &&)",
            "ALTER TABLE items ADD CONSTRAINT items_owner_fkey FOREIGN KEY (owner)"
            " REFERENCES parent (id) NOT VALID",
            "ALTER TABLE items ADD CONSTRAINT items_buddy_fkey FOREIGN KEY (buddy)"
            " REFERENCES parent (id) NOT VALID",
            "ALTER TABLE items ADD CONSTRAINT items_qty_small CHECK (qty < 10) NOT VALID",
            "UPDATE items SET qty = 0 WHERE id = 3",
        ])  # fmt: skip
        _wait_target(pair, src, url, "items", added)
        assert validated() == {
            "items_buddy_fkey": ("f", False),
            "items_during_excl": ("x", True),
            "items_owner_fkey": ("f", False),
            "items_pid_fkey": ("f", False),  # items was installed before parent
        }
        with psycopg.connect(url) as dst, pytest.raises(psycopg.errors.ExclusionViolation):
            dst.execute("INSERT INTO items (id, during) VALUES (100, int4range(12, 14))")
        # Back to back: the schema op may be decoded after the VALIDATE.
        _run(src, [
            "UPDATE items SET owner = 1 WHERE owner > 3",
            "ALTER TABLE items VALIDATE CONSTRAINT items_owner_fkey",
        ])  # fmt: skip
        _wait_target(pair, src, url, "items", added)
        _run(src, ["UPDATE items SET buddy = 1 WHERE buddy > 3"])
        _wait_target(pair, src, url, "items", added)
        _run(src, ["ALTER TABLE items VALIDATE CONSTRAINT items_buddy_fkey"])
        wait_until(
            lambda: validated()["items_buddy_fkey"] == ("f", True),
            60,
            "the target's foreign key validated",
            interval=0.3,
        )
        _wait_target(pair, src, url, "items", added)
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()
        src.close()
