"""The differential test's generator and comparator: seeded schemas and transaction
streams on a SQLite or PostgreSQL source, and a value-for-value comparison of a
target with its source through the documented type mapping (docs/types.md).

Schemas (:func:`make_schema`): ``t_all`` (a key and every column of the source
dialect's catalogue, with a large value: a PostgreSQL source TOASTs it and sends it
as "unchanged" when an update leaves it out), ``t_pair`` (a two-column key: key
changes and deletes matched on two columns) and a few ``t_<n>`` tables with a seeded
subset of the columns.  The catalogues: :data:`SQLITE_COLUMNS` (every affinity, and
values SQLite keeps in another storage class than the declared type's: the *odd*
values, replicated exactly only SQLite to SQLite) and ``tests.support.pg_types``'
``COLUMNS`` for PostgreSQL (every built-in type and their extremes).

Streams (:class:`Workload`): transactions of 1-4 statements (inserts, updates of a
few columns, key changes, deletes) on random tables, and now and then one that
touches every table.

Comparison (:func:`differences`): both sides are read as canonical cells
(:func:`sqlite_cells`: storage class and exact bytes; :func:`pg_cells`: the text
output under pinned settings) and the source's cells are mapped to the target
dialect's (:func:`expected`); a difference names table, key, column and both values.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
import re
import sqlite3
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import pg_types

__all__ = [
    "SQLITE_COLUMNS",
    "Schema",
    "Sql",
    "Workload",
    "differences",
    "make_schema",
    "run",
]


class Sql(str):
    """A SQLite value written as an SQL expression (what no Python parameter can be:
    TEXT that is not UTF-8 clean)."""


Gen = Callable[[random.Random], object]


def _choice(*values: object) -> Gen:
    return lambda r: r.choice(values)


def _text(r: random.Random) -> str:
    alphabet = string.ascii_letters + " ,'\"\\{}é€😀\t\n\x00"
    return "".join(r.choice(alphabet) for _ in range(r.randint(0, 12)))


def _big(r: random.Random) -> str:
    return "".join(r.choice(string.ascii_letters) for _ in range(3000))


@dataclass(frozen=True)
class SqliteColumn:
    """A SQLite column: its declared type, values of the type, and *odd* values (of
    another storage class, kept so by the affinity) that only SQLite can hold."""

    name: str
    type: str
    typed: Gen
    odd: Gen | None = None


# Not here: REAL -0.0 (SQLite keeps its sign only in a column without affinity, and
# none of its SQL functions renders it, so the capture triggers carry 0.0: docs/types.md).
SQLITE_COLUMNS: list[SqliteColumn] = [
    SqliteColumn("c_int", "INTEGER",
                 _choice(0, -1, 2**63 - 1, -(2**63), 2**53 + 1, -(2**53) - 3, None),
                 _choice("abc", 1.5, b"\x00\x01", "")),
    SqliteColumn("c_real", "REAL",
                 _choice(0.1, -2.5, 1.7976931348623157e308, 5e-324, float("inf"),
                         float("-inf"), 3.0, None),
                 _choice("x", b"\x00")),
    SqliteColumn("c_text", "TEXT", lambda r: r.choice([_text(r), "", "NULL", "\\.", None]),
                 _choice(Sql("CAST(X'41FF00FE' AS TEXT)"), b"\x00\xff", 12)),
    SqliteColumn("c_blob", "BLOB", _choice(b"", b"\x00" * 10, b"\x00\xffabc\x00", None),
                 _choice(12, 1.5, "t")),
    SqliteColumn("c_any", "",
                 _choice(b"\x00", None),
                 _choice(1, "txt", 2**62 + 1, 1.5, Sql("CAST(X'80' AS TEXT)"))),
    SqliteColumn("c_num", "NUMERIC",
                 _choice(5, 2**63 - 1, 1.5, 0.1, "1.50", -7, None),
                 _choice("12abc", b"\x01", "")),
    SqliteColumn("c_dec", "DECIMAL(10,2)", _choice(12.34, 5, -0.5, None), _choice("n/a", 12.345)),
    SqliteColumn("c_bool", "BOOLEAN", _choice(0, 1, None), _choice("yes", 2, "true")),
    SqliteColumn("c_date", "DATE", _choice("2024-02-29", "0001-01-01", "9999-12-31", None),
                 _choice("not a date", 20240229)),
    SqliteColumn("c_time", "TIME", _choice("00:00:00", "23:59:59.999999", None),
                 _choice("noon")),
    SqliteColumn("c_ts", "TIMESTAMP",
                 _choice("2024-02-29T12:34:56.789012", "0001-01-01T00:00:00", None),
                 _choice("2024-02-29 12:34:56", "now", 1700000000)),
    SqliteColumn("c_dt", "DATETIME", _choice("2000-01-01T00:00:00", None),
                 _choice("2000-01-01 00:00:00.5")),
    SqliteColumn("c_tstz", "TIMESTAMPTZ",
                 _choice("2024-02-29T12:34:56.789012+02:00", "2000-01-01T00:00:00-05:30",
                         "0001-01-01T00:00:00+00:00", "9999-12-31T23:59:59.5+00:00", None),
                 _choice("tomorrow", 1700000000)),
    SqliteColumn("c_vc", "VARCHAR(20)", lambda r: r.choice([_text(r).replace("\x00", ""), None]),
                 _choice(7, 0.25)),
    SqliteColumn("c_json", "JSON", _choice('{"b": 1,  "a": [1, 2.50]}', "[]", "null", None),
                 _choice("{not json")),
    SqliteColumn("c_big", "TEXT", lambda r: r.choice([None, _big(r)])),
]  # fmt: skip


# -- schemas ------------------------------------------------------------------------


@dataclass
class Table:
    name: str
    key: list[tuple[str, str]]  # (column, type)
    columns: list[tuple[str, str, Gen]]  # non-key (column, type, generator)

    @property
    def names(self) -> list[str]:
        return [c for c, _ in self.key] + [c for c, _, _ in self.columns]


@dataclass
class Schema:
    dialect: str  # "sqlite" | "postgresql"
    tables: list[Table]

    def ddl(self) -> list[str]:
        out = [pg_types.TYPES] if self.dialect == "postgresql" else []
        for t in self.tables:
            cols = [f'"{c}" {ty}' for c, ty in t.key] + [f'"{c}" {ty}' for c, ty, _ in t.columns]
            keys = ", ".join(f'"{c}"' for c, _ in t.key)
            out.append(f'CREATE TABLE "{t.name}" ({", ".join(cols)}, PRIMARY KEY ({keys}))')
        return out

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)


def _sqlite_catalogue(odd: bool) -> list[tuple[str, str, Gen]]:
    out: list[tuple[str, str, Gen]] = []
    for c in SQLITE_COLUMNS:
        typed, other = c.typed, c.odd
        if odd and other is not None:
            gen: Gen = (lambda t, o: lambda r: o(r) if r.random() < 0.3 else t(r))(typed, other)
        else:  # PostgreSQL text holds no NUL
            gen = (lambda t: lambda r: _no_nul(t(r)))(typed)
        out.append((c.name, c.type.strip() or "", gen))
    return out


def _no_nul(v: object) -> object:
    return v.replace("\x00", "") if isinstance(v, str) else v


def make_schema(
    dialect: str, seed: int, *, odd: bool = True, exclude: tuple[str, ...] = ()
) -> Schema:
    """Seeded tables for a ``dialect`` source; ``odd``: SQLite values of another
    storage class than their column's (only SQLite targets hold them);
    ``exclude``: columns left out (types a path refuses)."""
    r = random.Random(seed)
    if dialect == "sqlite":
        catalogue = _sqlite_catalogue(odd)
        pair_key = [("k_text", "TEXT"), ("k_int", "INTEGER")]
        pair_value: list[tuple[str, str, Gen]] = [("v", "REAL", _choice(1.5, None, -3.0))]
    else:
        catalogue = list(pg_types.COLUMNS)
        pair_key = [(c, t) for c, t, _ in pg_types.KEYED_COLUMNS[:2]]
        pair_value = list(pg_types.KEYED_COLUMNS[2:])
    catalogue = [c for c in catalogue if c[0] not in exclude]
    tables = [
        Table("t_all", [("id", "bigint" if dialect == "postgresql" else "INTEGER")], catalogue),
        Table("t_pair", pair_key, pair_value),
    ]
    small = [c for c in catalogue if c[0] != "c_big"]
    for n in range(3):
        cols = r.sample(small, r.randint(2, 5))
        tables.append(Table(f"t_{n}", tables[0].key, cols))
    return Schema(dialect, tables)


# -- transaction streams -----------------------------------------------------------

Stmt = tuple[str, list[Any]]


def _pair_key(dialect: str, r: random.Random) -> tuple[object, ...]:
    if dialect == "sqlite":
        return (r.choice(["a", "b", "é", "a b", "z"]), r.randint(-(2**63), 2**63 - 1))
    return tuple(gen(r) for _, _, gen in pg_types.KEYED_COLUMNS[:2])


@dataclass
class Workload:
    """Seeded transactions over a :class:`Schema` (see the module docstring)."""

    schema: Schema
    seed: int
    r: random.Random = field(init=False)
    live: dict[str, list[tuple[object, ...]]] = field(init=False)
    next_id: int = 1

    def __post_init__(self) -> None:
        self.r = random.Random(self.seed)
        self.live = {t.name: [] for t in self.schema.tables}

    def _mark(self, ty: str) -> str:
        return f"%s::{ty}" if self.schema.dialect == "postgresql" else "?"

    def _where(self, t: Table) -> str:
        return " AND ".join(f'"{c}" = {self._mark(ty)}' for c, ty in t.key)

    def _new_key(self, t: Table) -> tuple[object, ...]:
        if t.name == "t_pair":
            return _pair_key(self.schema.dialect, self.r)
        self.next_id += 1
        return (self.next_id,)

    def _insert(self, t: Table) -> Stmt:
        key = self._new_key(t)
        if key in self.live[t.name]:
            return self._update(t)
        self.live[t.name].append(key)
        marks = [self._mark(ty) for _, ty in t.key] + [self._mark(ty) for _, ty, _ in t.columns]
        names = ", ".join(f'"{c}"' for c in t.names)
        values = [*key, *(gen(self.r) for _, _, gen in t.columns)]
        return f'INSERT INTO "{t.name}" ({names}) VALUES ({", ".join(marks)})', values

    def _update(self, t: Table) -> Stmt:
        key = self.r.choice(self.live[t.name])
        # a few columns; the large value rarely, so most updates leave it unchanged
        pool = [c for c in t.columns if c[0] != "c_big" or self.r.random() < 0.1] or t.columns
        chosen = self.r.sample(pool, min(len(pool), self.r.randint(1, 4)))
        sets = ", ".join(f'"{c}" = {self._mark(ty)}' for c, ty, _ in chosen)
        values = [gen(self.r) for _, _, gen in chosen]
        return f'UPDATE "{t.name}" SET {sets} WHERE {self._where(t)}', [*values, *key]

    def _rekey(self, t: Table) -> Stmt:
        old = self.r.choice(self.live[t.name])
        new = self._new_key(t)
        if new in self.live[t.name]:
            return self._update(t)
        self.live[t.name][self.live[t.name].index(old)] = new
        sets = ", ".join(f'"{c}" = {self._mark(ty)}' for c, ty in t.key)
        return f'UPDATE "{t.name}" SET {sets} WHERE {self._where(t)}', [*new, *old]

    def _delete(self, t: Table) -> Stmt:
        key = self.r.choice(self.live[t.name])
        self.live[t.name].remove(key)
        return f'DELETE FROM "{t.name}" WHERE {self._where(t)}', list(key)

    def statement(self, t: Table) -> Stmt:
        roll = self.r.random()
        if len(self.live[t.name]) < 3 or roll < 0.35:
            return self._insert(t)
        if roll < 0.7:
            return self._update(t)
        if roll < 0.8:
            return self._rekey(t)
        return self._delete(t)

    def transactions(self, count: int) -> Iterator[list[Stmt]]:
        for _ in range(count):
            if self.r.random() < 0.1:  # one transaction touching every table
                tables = list(self.schema.tables)
            else:
                tables = [self.r.choice(self.schema.tables) for _ in range(self.r.randint(1, 4))]
            yield [self.statement(t) for t in tables]


def _sqlite_statement(sql: str, params: list[Any]) -> tuple[str, list[Any]]:
    """Inline :class:`Sql` values (SQLite statements use ``?`` only)."""
    parts = sql.split("?")
    out, kept = [parts[0]], []
    for p, rest in zip(params, parts[1:], strict=True):
        if isinstance(p, Sql):
            out.append(str(p))
        else:
            out.append("?")
            kept.append(p)
        out.append(rest)
    return "".join(out), kept


def run(conn: Any, dialect: str, txns: Iterator[list[Stmt]]) -> None:
    """Run each transaction as one source transaction."""
    for stmts in txns:
        if dialect == "sqlite":
            conn.execute("BEGIN IMMEDIATE")
            for sql, params in stmts:
                conn.execute(*_sqlite_statement(sql, params))
            conn.execute("COMMIT")
        else:
            with conn.transaction():
                for sql, params in stmts:
                    conn.execute(sql, params)


# -- reading and comparing ------------------------------------------------------

Cell = tuple[str, object] | None  # (kind, exact value) or NULL


def _sqlite_cell(kind: str, v: object) -> Cell:
    if kind == "null":
        return None
    if kind == "real":
        assert isinstance(v, float)
        return ("real", v.hex())
    if kind in ("text", "blob"):
        assert isinstance(v, bytes)
        return (kind, v.hex())
    return (kind, v)


def sqlite_cells(path: Path, table: Table) -> dict[tuple[Cell, ...], list[Cell]]:
    """Every row of ``table`` as exact cells (storage class and bytes), by key."""
    conn = sqlite3.connect(str(path))
    try:
        cols = ", ".join(
            f'typeof("{c}"), CASE WHEN typeof("{c}") = \'text\' THEN CAST("{c}" AS BLOB) '
            f'ELSE "{c}" END'
            for c in table.names
        )
        rows = conn.execute(f'SELECT {cols} FROM "{table.name}"').fetchall()
    finally:
        conn.close()
    out = {}
    for r in rows:
        cells = [_sqlite_cell(r[i], r[i + 1]) for i in range(0, len(r), 2)]
        out[tuple(cells[: len(table.key)])] = cells
    return out


def pg_cells(dsn: str, table: Table) -> dict[tuple[Cell, ...], list[Cell]]:
    """Every row of ``table`` as the text output of each column, by key."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = pg_types.table_text(conn, f'"{table.name}"', table.names, [table.names[0]])
    out = {}
    for r in rows:
        cells: list[Cell] = [None if v is None else ("pg", v) for v in r]
        out[tuple(cells[: len(table.key)])] = cells
    return out


def _sqlite_affinity(decl: str) -> str:
    d = decl.upper()
    if "INT" in d:
        return "integer"
    if any(s in d for s in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if "BLOB" in d or not d:
        return "blob"
    if any(s in d for s in ("REAL", "FLOA", "DOUB")):
        return "real"
    return "numeric"


# PostgreSQL text output -> the SQLite cell the documented mapping gives (docs/types.md)
_PG_INT = re.compile(r"^(smallint|integer|bigint|oid)$|^posint$")


def _dec_text(d: decimal.Decimal) -> str:
    return "{:f}".format(d) if d.is_finite() else str(d)  # noqa: UP032


def pg_to_sqlite(pg_type: str, text: str) -> Cell:
    """The SQLite cell a PostgreSQL value of ``pg_type`` (as text) maps to."""
    base = pg_type.split("(")[0].strip()
    if _PG_INT.match(base):
        return ("integer", int(text))
    if base in ("real", "double precision"):  # NaN as TEXT, -0 as 0 (a REAL column)
        f = float(text)
        return ("text", b"NaN".hex()) if f != f else ("real", (f + 0.0).hex())
    if base == "boolean":  # ::text of a boolean is true/false (its output: t/f)
        return ("integer", int(text == "true"))
    if base == "char" and "(" in pg_type:  # ::text trims the padding its output keeps
        width = int(pg_type.split("(")[1].rstrip(")"))
        return ("text", text.ljust(width).encode().hex())
    if base == "inet":  # ::text shows a host's full mask, which its output leaves out
        host = "/32" if "." in text else "/128"
        return ("text", text.removesuffix(host).encode().hex())
    if base == "bytea":
        return ("blob", text[2:])
    if base == "numeric":
        return ("text", text.encode().hex())
    if base == "timestamptz" or (base.startswith("timestamp") and "with time zone" in pg_type):
        form = dt.datetime.fromisoformat(text).isoformat() if _python_range(text) else text
        return ("text", form.encode().hex())
    if base == "timestamp":
        form = text.replace(" ", "T") if _python_range(text) else text
        return ("text", form.encode().hex())
    return ("text", text.encode().hex())


def _python_range(text: str) -> bool:
    try:
        dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def sqlite_to_pg(decl: str, cell: Cell) -> Cell:
    """The PostgreSQL text a SQLite cell of declared type ``decl`` maps to."""
    if cell is None:
        return None
    kind, v = cell
    d = decl.upper().split("(")[0].strip()
    if kind == "integer":
        if d in ("BOOLEAN", "BOOL"):
            return ("pg", "true" if v else "false")
        if d in ("DECIMAL", "NUMERIC") and "(" in decl:
            scale = int(decl.split(",")[1].rstrip(")"))
            return (
                "pg",
                _dec_text(decimal.Decimal(int(str(v))).quantize(decimal.Decimal(1).scaleb(-scale))),
            )
        return ("pg", str(v))
    if kind == "real":
        f = float.fromhex(str(v))
        if d in ("DECIMAL", "NUMERIC"):
            dec = decimal.Decimal(repr(f))
            if "(" in decl:
                scale = int(decl.split(",")[1].rstrip(")"))
                dec = dec.quantize(decimal.Decimal(1).scaleb(-scale))
            return ("pg", _dec_text(dec))
        if f != f:
            return ("pg", "NaN")
        if f in (float("inf"), float("-inf")):
            return ("pg", "Infinity" if f > 0 else "-Infinity")
        return ("pg", repr(f).replace("e+", "e+"))
    if kind == "blob":
        return ("pg", "\\x" + str(v))
    text = bytes.fromhex(str(v)).decode()
    if d in ("TIMESTAMP", "DATETIME"):
        return ("pg", dt.datetime.fromisoformat(text).isoformat(" "))
    if d == "TIMESTAMPTZ":  # the instant, shown in UTC (pg_types.table_text's TimeZone)
        at = dt.datetime.fromisoformat(text).astimezone(dt.UTC).isoformat(" ")
        at = at.removesuffix("+00:00")
        if "." in at:  # PostgreSQL shows no trailing zeros of the fraction
            at = at.rstrip("0").rstrip(".")
        return ("pg", at + "+00")
    return ("pg", text)


def _float_cell(cell: Cell) -> Cell:
    """PostgreSQL's float text compared as the float it denotes."""
    if cell is None or cell[0] != "pg":
        return cell
    try:
        return ("float", float(str(cell[1])).hex())
    except ValueError:
        return cell


def expected(source: Schema, target_dialect: str, table: Table, rows: dict) -> dict:
    """``rows`` of a source ``table`` as the target dialect holds them."""
    if source.dialect == target_dialect:
        return rows
    types = [ty for _, ty in table.key] + [ty for _, ty, _ in table.columns]
    out = {}
    for cells in rows.values():
        if source.dialect == "postgresql":
            mapped = [
                None if c is None else pg_to_sqlite(ty, str(c[1]))
                for ty, c in zip(types, cells, strict=True)
            ]
        else:
            mapped = [sqlite_to_pg(ty, c) for ty, c in zip(types, cells, strict=True)]
        out[tuple(mapped[: len(table.key)])] = mapped
    return out


def differences(
    source: Schema, src: str | Path, target_dialect: str, dst: str | Path, limit: int = 40
) -> list[str]:
    """Rows and values of every table that differ between target and source (mapped)."""
    out: list[str] = []

    def read(dialect: str, where: str | Path, table: Table) -> dict:
        if dialect == "sqlite":
            return sqlite_cells(Path(where), table)
        return pg_cells(str(where), table)

    for table in source.tables:
        try:
            theirs = read(target_dialect, dst, table)
        except Exception as e:
            out.append(f"{table.name}: cannot read the target: {e}")
            continue
        ours = expected(source, target_dialect, table, read(source.dialect, src, table))
        types = [ty for _, ty in table.key] + [ty for _, ty, _ in table.columns]
        for key in sorted(set(ours) | set(theirs), key=repr):
            a, b = ours.get(key), theirs.get(key)
            if a is None or b is None:
                out.append(
                    f"{table.name} {key!r:.60}: only on the {'target' if a is None else 'source'}"
                )
                continue
            for name, ty, x, y in zip(table.names, types, a, b, strict=True):
                if target_dialect == "postgresql" and ty.upper() in ("REAL", "DOUBLE"):
                    x, y = _float_cell(x), _float_cell(y)
                if x != y:
                    out.append(
                        f"{table.name} {key!r:.40} {name} ({ty}): source {x!r:.60} target {y!r:.60}"
                    )
    return out[:limit]
