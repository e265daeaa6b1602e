"""A seeded generator of PostgreSQL rows over every built-in type, and a row-by-row,
value-by-value comparison of two databases.

``SCHEMA`` creates two tables on a source: ``typed`` (a bigint key and one column per
type, including a large ``c_big`` that PostgreSQL TOASTs) and ``keyed`` (a composite
key of uuid and inet, so deletes and key changes match on types the wire carries as
text).  :class:`TypedWorkload` yields transactions (lists of ``(sql, params)``) of
inserts, updates of a few columns (``c_big`` rarely, so most updates send it as
"unchanged TOAST"), key changes and deletes; each value is a text literal cast to its
column's type, drawn from ordinary values and the extremes (NULL, NaN, ±Infinity,
-0, BC and far-future dates, ``24:00:00``, multi-dimensional arrays with NULLs, ...).
:func:`table_text` reads a table as text (``::text`` of every column, in key order)
under pinned session settings, the form in which two databases are compared.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["COLUMNS", "KEYED_COLUMNS", "SCHEMA", "TypedWorkload", "schema_sql", "table_text"]

TYPES = """
CREATE EXTENSION IF NOT EXISTS citext;
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'it''s "complicated"');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE DOMAIN short_text AS varchar(10);
CREATE TYPE pair AS (a integer, b text);
"""

Gen = Callable[[random.Random], str | None]


def _pick(*choices: str | None) -> Gen:
    return lambda r: r.choice(choices)


def _words(r: random.Random, n: int = 3) -> str:
    alphabet = string.ascii_letters + string.digits + " ,'\"\\{}()é€😀\t\n"
    return "".join(r.choice(alphabet) for _ in range(r.randint(0, n * 4)))


def _uuid(r: random.Random) -> str:
    return "%032x" % r.getrandbits(128)  # noqa: UP031 (fixed width)


def _big(r: random.Random) -> str:
    # Incompressible, so PostgreSQL stores it out of line (TOAST) at ~20 kB.
    return "".join(r.choice(string.ascii_letters + string.digits) for _ in range(20_000))


# (column, type, generator of a text literal or None).  Every column but the key is
# nullable; each generator mixes ordinary values and the type's extremes.
COLUMNS: list[tuple[str, str, Gen]] = [
    ("c_int2", "smallint", _pick("0", "-32768", "32767", None, "7")),
    ("c_int4", "integer", _pick("-2147483648", "2147483647", "42", None)),
    ("c_int8", "bigint", _pick("-9223372036854775808", "9223372036854775807", "0", None)),
    ("c_oid", "oid", _pick("0", "4294967295", "1259", None)),
    (
        "c_num",
        "numeric",
        _pick(
            "NaN",
            "Infinity",
            "-Infinity",
            "0",
            "-0.000000000000000000000000000000000001",
            "1" + "0" * 120 + ".5",
            "123456789012345678901234567890.123456789012345678901234567890",
            "1.50",
            None,
        ),
    ),
    ("c_num_s", "numeric(12,3)", _pick("1.5", "-999999999.999", "0", "NaN", None)),
    ("c_f4", "real", _pick("NaN", "Infinity", "-Infinity", "-0", "1.1", "3.4028235e38", None)),
    (
        "c_f8",
        "double precision",
        _pick(
            "NaN", "Infinity", "-Infinity", "-0", "0.1", "5e-324", "1.7976931348623157e308", None
        ),
    ),
    ("c_money", "money", _pick("0", "-92233720368547758.08", "12.34", None)),
    ("c_text", "text", lambda r: r.choice([None, "", "\\.", "NULL", _words(r, 10)])),
    ("c_vc", "varchar(20)", lambda r: r.choice([None, "", _words(r, 1)[:20]])),
    ("c_ch", "char(5)", _pick("a", "", "abcde", None, " x ")),
    ("c_qchar", '"char"', _pick("a", "Z", None)),
    ("c_name", "name", _pick("pg_class", "Mixed Case", None)),
    ("c_big", "text", lambda r: r.choice([None, _big(r), _big(r)])),
    ("c_bytea", "bytea", _pick("\\x", "\\x00ff00", "\\x" + "00" * 100, None)),
    ("c_bool", "boolean", _pick("true", "false", None)),
    (
        "c_date",
        "date",
        _pick("infinity", "-infinity", "0044-03-15 BC", "5874897-12-31", "2000-02-29", None),
    ),
    ("c_time", "time", _pick("00:00:00", "24:00:00", "23:59:59.999999", None)),
    ("c_timetz", "time with time zone", _pick("12:00:00+05:30", "00:00:00-15:59", None)),
    (
        "c_ts",
        "timestamp",
        _pick(
            "infinity",
            "-infinity",
            "4713-01-01 00:00:00 BC",
            "294276-12-31 23:59:59.999999",
            "2024-02-29 12:34:56.789012",
            None,
        ),
    ),
    (
        "c_ts3",
        "timestamp(3) with time zone",
        _pick("infinity", "2024-02-29 12:34:56.789+02", "0001-01-01 00:00:00+00 BC", None),
    ),
    (
        "c_tstz",
        "timestamptz",
        _pick("-infinity", "1999-12-31 23:59:59.999999-12", "10000-01-01 00:00:00+00", None),
    ),
    (
        "c_interval",
        "interval",
        _pick("1 year 2 mons 3 days 04:05:06.789", "-178000000 years", "00:00:00", None),
    ),
    ("c_uuid", "uuid", lambda r: r.choice([None, _uuid(r)])),
    ("c_inet", "inet", _pick("192.168.0.1/24", "::1", "10.0.0.1", None)),
    ("c_cidr", "cidr", _pick("10.0.0.0/8", "2001:db8::/32", None)),
    ("c_mac", "macaddr", _pick("08:00:2b:01:02:03", None)),
    ("c_mac8", "macaddr8", _pick("08:00:2b:01:02:03:04:05", None)),
    ("c_json", "json", _pick('{"b": 1,  "a": [1, 2.50], "a": null}', " [ ] ", "null", None)),
    ("c_jsonb", "jsonb", _pick('{"b": 1, "a": [1, 2.50]}', '"\\u00e9"', "{}", None)),
    ("c_xml", "xml", _pick("<a x='1'>t &amp; <b/></a>", "text only", None)),
    ("c_bit", "bit(8)", _pick("10101010", "00000000", None)),
    ("c_varbit", "bit varying", _pick("", "1", "1010101010101", None)),
    ("c_tsv", "tsvector", _pick("a fat:1A cat:2B,3", "'it''s' x", "", None)),
    ("c_tsq", "tsquery", _pick("fat & (rat | !cat)", "'a' <-> 'b'", None)),
    ("c_enum", "mood", _pick("sad", "happy", 'it\'s "complicated"', None)),
    ("c_dom", "posint", _pick("1", "2147483647", None)),
    ("c_dom_txt", "short_text", _pick("", "ten chars!", None)),
    ("c_pair", "pair", _pick('(1,"a b")', "(,)", '(-1,"x""y")', None)),
    (
        "c_int_arr",
        "integer[]",
        _pick("{}", "{1,NULL,3}", "{{1,2},{3,NULL}}", "[0:1]={7,8}", "{NULL}", None),
    ),
    ("c_text_arr", "text[]", _pick('{"a,b","",NULL,"NULL","q\\"x"}', '{{"x"},{"y"}}', None)),
    ("c_uuid_arr", "uuid[]", lambda r: r.choice([None, "{" + _uuid(r) + ",NULL}"])),
    ("c_enum_arr", "mood[]", _pick("{sad,happy}", "{}", None)),
    ("c_num_arr", "numeric[]", _pick("{NaN,Infinity,1.5000}", None)),
    ("c_int4range", "int4range", _pick("[1,10)", "empty", "(,5]", None)),
    ("c_numrange", "numrange", _pick("[1.5,Infinity)", "(,)", None)),
    ("c_tstzrange", "tstzrange", _pick("[2020-01-01 00:00:00+00,infinity)", "empty", None)),
    ("c_multirange", "int4multirange", _pick("{[1,3),[5,9)}", "{}", None)),
    ("c_point", "point", _pick("(1.5,-2)", "(NaN,Infinity)", None)),
    ("c_circle", "circle", _pick("<(0,0),1.5>", None)),
    ("c_regclass", "regclass", _pick("pg_class", "pg_type", None)),
    ("c_lsn", "pg_lsn", _pick("0/0", "FFFFFFFF/FFFFFFFF", None)),
    # extension types (contrib): OIDs assigned at CREATE EXTENSION, so they differ
    # between source and target
    ("c_citext", "citext", _pick("MiXeD Case", "", "é€", None)),
    ("c_hstore", "hstore", _pick('"a"=>"1", "b c"=>NULL, "q\\"x"=>"y"', "", None)),
]

KEYED_COLUMNS: list[tuple[str, str, Gen]] = [
    ("k_uuid", "uuid", _uuid),
    ("k_inet", "inet", _pick("10.0.0.1", "::1", "192.168.1.0/24")),
    ("v", "interval", _pick("1 day", "-00:00:01", None)),
]


def schema_sql(columns: list[tuple[str, str, Gen]]) -> str:
    """The types and both tables, ``typed`` with ``columns``."""
    return (
        TYPES
        + "CREATE TABLE typed (id bigint PRIMARY KEY, "
        + ", ".join(f"{c} {t}" for c, t, _ in columns)
        + ");\nCREATE TABLE keyed (k_uuid uuid, k_inet inet, v interval,"
        " PRIMARY KEY (k_uuid, k_inet));\n"
    )


SCHEMA = schema_sql(COLUMNS)

Stmt = tuple[str, list[Any]]  # as built; run as (sql, tuple of params)


class TypedWorkload:
    """Seeded transactions over ``typed`` and ``keyed`` (see the module docstring)."""

    def __init__(self, seed: int, columns: list[tuple[str, str, Gen]] = COLUMNS) -> None:
        self.columns = columns
        self.r = random.Random(seed)
        self.ids: list[int] = []
        self.next_id = 1
        self.keys: list[tuple[str, str]] = []

    def _row(self, columns: list[tuple[str, str, Gen]]) -> list[str | None]:
        return [gen(self.r) for _, _, gen in columns]

    def _insert_typed(self) -> Stmt:
        ident = self.next_id
        self.next_id += 1
        self.ids.append(ident)
        cols = ", ".join(c for c, _, _ in self.columns)
        marks = ", ".join(f"%s::{t}" for _, t, _ in self.columns)
        return f"INSERT INTO typed (id, {cols}) VALUES (%s, {marks})", [
            ident,
            *self._row(self.columns),
        ]

    def _update_typed(self) -> Stmt:
        ident = self.r.choice(self.ids)
        # A few columns; c_big rarely, so most updates leave its TOASTed value out.
        pool = [c for c in self.columns if c[0] != "c_big" or self.r.random() < 0.1]
        chosen = self.r.sample(pool, self.r.randint(1, 4))
        sets = ", ".join(f"{c} = %s::{t}" for c, t, _ in chosen)
        return f"UPDATE typed SET {sets} WHERE id = %s", [
            *[gen(self.r) for _, _, gen in chosen],
            ident,
        ]

    def _rekey_typed(self) -> Stmt:
        old = self.r.choice(self.ids)
        new = self.next_id
        self.next_id += 1
        self.ids[self.ids.index(old)] = new
        return "UPDATE typed SET id = %s WHERE id = %s", [new, old]

    def _delete_typed(self) -> Stmt:
        ident = self.r.choice(self.ids)
        self.ids.remove(ident)
        return "DELETE FROM typed WHERE id = %s", [ident]

    def _keyed(self) -> Stmt:
        roll = self.r.random()
        if not self.keys or roll < 0.4:
            row = self._row(KEYED_COLUMNS)
            key = (str(row[0]), str(row[1]))
            if key in self.keys:
                return "SELECT 1", []
            self.keys.append(key)
            return "INSERT INTO keyed VALUES (%s::uuid, %s::inet, %s::interval)", row
        key = self.r.choice(self.keys)
        if roll < 0.6:
            self.keys.remove(key)
            return "DELETE FROM keyed WHERE k_uuid = %s::uuid AND k_inet = %s::inet", list(key)
        if roll < 0.8:  # a key change
            new = (_uuid(self.r), key[1])
            self.keys[self.keys.index(key)] = new
            return (
                "UPDATE keyed SET k_uuid = %s::uuid WHERE k_uuid = %s::uuid AND k_inet = %s::inet",
                [new[0], *key],
            )
        return (
            "UPDATE keyed SET v = %s::interval WHERE k_uuid = %s::uuid AND k_inet = %s::inet",
            [KEYED_COLUMNS[2][2](self.r), *key],
        )

    def statement(self) -> Stmt:
        roll = self.r.random()
        if len(self.ids) < 3 or roll < 0.3:
            return self._insert_typed()
        if roll < 0.6:
            return self._update_typed()
        if roll < 0.68:
            return self._rekey_typed()
        if roll < 0.78:
            return self._delete_typed()
        return self._keyed()

    def transactions(self, count: int) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
        for _ in range(count):
            stmts = [self.statement() for _ in range(self.r.randint(1, 5))]
            yield [(q, tuple(params)) for q, params in stmts]


def table_text(
    conn: Any, table: str, columns: list[str], key: list[str], where: str = "TRUE"
) -> list[tuple[Any, ...]]:
    """Every row of ``table`` (``where`` holds) as the text of each column, in key order."""
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute("SET DateStyle = 'ISO, YMD'")
    conn.execute("SET IntervalStyle = 'postgres'")
    conn.execute("SET extra_float_digits = 1")
    cols = ", ".join(f'"{c}"::text' for c in columns)
    order = ", ".join(f'"{k}"' for k in key)
    query = f"SELECT {cols} FROM {table} WHERE {where} ORDER BY {order}"
    return [tuple(r) for r in conn.execute(query)]
