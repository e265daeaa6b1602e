"""PostgreSQL capture's wire bytes (publisher/capture/postgres/_pgwire.py) equal what
the protobuf objects of ``_pgtypes.to_value`` serialize to, for every column type and
the text output of its ordinary values and extremes: a differential over a seeded
generator, the objects as the oracle; and whole row changes and entries the same as
the ones built from those objects."""

from __future__ import annotations

import datetime as dt
import decimal
import random
import string
import struct
from pathlib import Path

import pytest

from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres._pgoutput import (
    UNCHANGED,
    Datum,
    Delete,
    Insert,
    Update,
    parse_pgoutput,
)
from publisher.capture.postgres._pgtypes import TypeInfo, to_value
from publisher.capture.postgres._pgwire import RowWriter, value_wire
from publisher.capture.protowire import entry_of, framed
from publisher.config import PublicationConfig
from publisher.errors import SourceError
from publisher.log import open_log
from publisher.publication import Publication
from tests.support.pgoutput import tuple_data

T = pb.ColumnType
TYPES = [t for t in T.values() if t != T.COLUMN_TYPE_UNSPECIFIED] + [T.COLUMN_TYPE_UNSPECIFIED]
SCALES = {T.COLUMN_TYPE_DECIMAL: (0, 2, 5, 30)}

# Text outputs as PostgreSQL writes them under SESSION_GUCS, the extremes of each
# type, and texts a column of another type sends (each is tried on every type).
EDGES: list[str] = [
    "0", "1", "-1", "63", "64", "-64", "-65", "127", "128", "8191", "8192",
    "2147483647", "-2147483648", "4294967295",
    "9223372036854775807", "-9223372036854775808", "9223372036854775808",
    "-9223372036854775809", "99999999999999999999999",
    "NaN", "Infinity", "-Infinity", "-0", "0.0", "-0.00", "1.50", "12.345", "0.005",
    "-999999999.999", "1" + "0" * 120 + ".5", "0.000000000000000000000000000000000001",
    "123456789012345678901234567890.123456789012345678901234567890", "1e+300", "5e-324",
    "3.4028235e+38", "0.30000000000000004", "1.7976931348623157e+308",
    "", " ", "a", "é", "😀", "x" * 127, "x" * 128, "y" * 20_000, "\t\n,'\"\\{}()",
    "\\x", "\\x00ff", "\\xDEADbeef", "\\x0", "00ff", "\\x" + "ab" * 100,
    "t", "f", "true", "false", "yes",
    "1970-01-01", "1969-12-31", "2024-02-29", "0001-01-01", "9999-12-31", "infinity",
    "-infinity", "0044-03-15 BC", "10000-01-01", "2024-02-30",
    "00:00:00", "23:59:59.999999", "24:00:00", "12:34:56.5", "01:02:03+02",
    "1970-01-01 00:00:00", "1969-12-31 23:59:59.999999", "2024-01-02 03:04:05.5",
    "0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "1900-01-01 00:00:00 BC",
    "1970-01-01 00:00:00+00", "1969-12-31 23:59:59.999999+00", "2024-01-02 03:04:05+00",
    "0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00", "2024-01-02 03:04:05+05:30",
    '{"a": 1}', "[1, 2, null]", "null", '"é😀"', "{1,2}", "(1,x)", "192.168.0.1/24",
    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "1 day 02:03:04",
]  # fmt: skip


def _random_text(rng: random.Random, ctype: int) -> str:
    """A random text output of a value of ``ctype``, as the server would write it."""
    if ctype == T.COLUMN_TYPE_INTEGER:
        return str(rng.randint(-(2**63), 2**63 - 1) >> rng.randrange(64))
    if ctype == T.COLUMN_TYPE_DECIMAL:
        digits = "".join(rng.choice(string.digits) for _ in range(rng.randint(1, 40)))
        point = rng.randint(0, len(digits))
        text = (digits[:point] or "0") + ("." + digits[point:] if digits[point:] else "")
        return rng.choice(["", "-"]) + text
    if ctype == T.COLUMN_TYPE_FLOAT:
        return repr(rng.choice([rng.random(), rng.uniform(-1e300, 1e300), rng.gauss(0, 1e-300)]))
    if ctype == T.COLUMN_TYPE_BYTES:
        return "\\x" + rng.randbytes(rng.choice([0, 1, 5, 70, 200])).hex()
    if ctype == T.COLUMN_TYPE_BOOLEAN:
        return rng.choice(["t", "f"])
    day = dt.date(1, 1, 1) + dt.timedelta(days=rng.randrange(3_652_059))
    moment = dt.datetime.combine(day, dt.time()) + dt.timedelta(
        microseconds=rng.randrange(86_400_000_000)
    )
    if ctype == T.COLUMN_TYPE_DATE:
        return day.isoformat()
    if ctype == T.COLUMN_TYPE_TIME:
        return moment.time().isoformat()
    if ctype == T.COLUMN_TYPE_TIMESTAMP:
        return moment.isoformat(sep=" ")
    if ctype == T.COLUMN_TYPE_TIMESTAMPTZ:
        return moment.isoformat(sep=" ") + "+00"
    alphabet = string.printable + "é€😀\u0000"
    return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 3, 40, 130, 300])))


def _infos() -> list[TypeInfo]:
    return [TypeInfo(ctype, 0, scale, "x") for ctype in TYPES for scale in SCALES.get(ctype, (0,))]


def _oracle(d: str | None, info: TypeInfo) -> bytes:
    return to_value(d, info).SerializeToString()


@pytest.mark.parametrize("info", _infos(), ids=lambda i: f"{i.ctype}-{i.scale}")
def test_values_are_the_bytes_of_to_value(info: TypeInfo) -> None:
    """Every text (each type's own, its extremes, other types' texts) and NULL gives
    the very bytes the Value object serializes to."""
    rng = random.Random(f"pgwire-{info.ctype}-{info.scale}")
    wire = value_wire(info)
    texts: list[str | None] = [None, *EDGES]
    texts += [_random_text(rng, info.ctype) for _ in range(400)]
    texts += [_random_text(rng, rng.choice(TYPES)) for _ in range(100)]
    for text in texts:
        assert wire(text) == _oracle(text, info), (info.ctype, text)
    for text in EDGES:  # the first value of a column (the encoders keep a Value each)
        assert value_wire(info)(text) == _oracle(text, info), (info.ctype, text)
    with pytest.raises(SourceError, match="unchanged TOAST"):
        wire(UNCHANGED)


def test_integers_and_canonical_decimals_read_as_bytes_are_the_objects_bytes() -> None:
    """The forms read straight from the message's bytes (integers by their zigzag,
    numeric(p, s) texts already as ``decimal_text`` writes them) hold at their bounds:
    every zigzag length, 28 and 29 digits, scales 1 to 8, leading zeros, and texts one
    step outside each form, against the objects."""
    ints = [0, 1, -1]
    for bits in (6, 7, 13, 14, 20, 21, 27, 28, 62, 63, 64):
        for n in (2**bits - 1, 2**bits, 2**bits + 1):
            ints += [n // 2, -(n // 2), n, -n]
    texts = [str(n) for n in ints] + [" 7", "+7", "1_000", "07", "٣", "", "-"]
    for info in (TypeInfo(T.COLUMN_TYPE_INTEGER, 0, 0, "bigint"),):
        for text in texts:
            assert value_wire(info)(text) == _oracle(text, info), text
    for scale in range(0, 9):
        info = TypeInfo(T.COLUMN_TYPE_DECIMAL, 30, scale, "numeric")
        decimals = ["", "0" * scale, "1" * scale, "9" * scale, "0" * (scale - 1) + "1"]
        texts = ["0.00", "-0.00", "00.50", "0.5", "1.", ".5", "1e2", "NaN", "٣.00"]
        for integer in ("0", "1", "-0", "-1", "10", "007", "9" * (28 - scale), "9" * (29 - scale)):
            for frac in decimals:
                texts += [f"{integer}.{frac}", f"{integer}.{frac}0", integer]
        for text in texts:
            assert value_wire(info)(text) == _oracle(text, info), (scale, text)


def _row_op(
    table: str,
    op: int,
    infos: list[TypeInfo],
    key: list[int],
    old: tuple[Datum, ...] | None,
    new: tuple[Datum, ...] | None,
) -> bytes:
    """The row change built from Value objects (the oracle of RowWriter)."""
    rc = pb.RowChange(table=table, op=op)  # type: ignore[arg-type]
    if op != pb.ROW_OP_INSERT:
        image = old if old is not None else new
        assert image is not None
        rc.key.extend(to_value(image[k], infos[k]) for k in key)  # type: ignore[arg-type]
    if new is not None:
        rc.row.extend(to_value(d, i) for d, i in zip(new, infos, strict=True))  # type: ignore[arg-type]
    return pb.Op(row=rc).SerializeToString()


def _cell(rng: random.Random, info: TypeInfo) -> str | None:
    """NULL, an extreme (often carried as text), or an ordinary value of the column."""
    draw = rng.random()
    return (
        None if draw < 0.2 else rng.choice(EDGES) if draw < 0.35 else _random_text(rng, info.ctype)
    )


def _row(rng: random.Random, infos: list[TypeInfo]) -> tuple[Datum, ...]:
    return tuple(_cell(rng, i) for i in infos)


def test_row_changes_and_entries_are_the_bytes_of_the_objects() -> None:
    """Inserts, updates (with and without the old row) and deletes of random rows over
    random column lists, and the entry holding them, equal the objects' bytes."""
    rng = random.Random("pgwire-rows")
    entry = pb.Entry()
    ops: list[bytes] = []
    for n in range(300):
        infos = [rng.choice(_infos()) for _ in range(rng.randint(1, 8))]
        key = sorted(rng.sample(range(len(infos)), rng.randint(1, len(infos))))
        table = rng.choice(["public.t", "s.é😀", "x" * 200, ""])

        writer = RowWriter(table, infos, key)
        kind = n % 4
        new, old = _row(rng, infos), _row(rng, infos)
        if kind == 0:
            got, want = writer.insert(new), _row_op(table, pb.ROW_OP_INSERT, infos, key, None, new)
        elif kind == 1:
            got = writer.update(new, new)
            want = _row_op(table, pb.ROW_OP_UPDATE, infos, key, None, new)
        elif kind == 2:
            got = writer.update(old, new)
            want = _row_op(table, pb.ROW_OP_UPDATE, infos, key, old, new)
        else:
            got, want = writer.delete(old), _row_op(table, pb.ROW_OP_DELETE, infos, key, old, None)
        assert got == want, (n, kind)
        ops.append(got)
        entry.ops.append(pb.Op.FromString(want))
    assert entry_of(ops).SerializeToString() == entry.SerializeToString()
    assert entry_of([]).SerializeToString() == b""


def test_decimal_scale_and_fallbacks_read_as_before() -> None:
    """Spot checks a reader can follow: numeric(p,2) quantized, values Python cannot
    hold carried as text, a wrong column count refused."""
    num = TypeInfo(T.COLUMN_TYPE_DECIMAL, 12, 2, "numeric")
    assert pb.Value.FromString(value_wire(num)("1.5")).decimal == "1.50"
    assert pb.Value.FromString(value_wire(num)("NaN")).decimal == str(decimal.Decimal("NaN"))
    day = TypeInfo(T.COLUMN_TYPE_DATE, 0, 0, "date")
    assert pb.Value.FromString(value_wire(day)("infinity")).text == "infinity"
    writer = RowWriter("t", [num, day], [0])
    with pytest.raises(ValueError):
        writer.insert(("1.5",))


def _generic(writer: RowWriter, payload: bytes) -> bytes:
    """The Op the events' path writes for a row message (the oracle of from_message)."""
    ev = parse_pgoutput(payload)
    if isinstance(ev, Insert):
        return writer.insert(ev.new)
    if isinstance(ev, Update):
        return writer.update(ev.old if ev.old is not None else ev.new, ev.new)
    assert isinstance(ev, Delete)
    return writer.delete(ev.old)


def test_row_messages_read_straight_into_the_ops_of_their_events() -> None:
    """I, U (no old row, 'K' key, 'O' whole old row) and D messages of random rows give
    the Op their parsed events give; a message the events' path must read (an unchanged
    TOAST or binary cell, another column count, cut short, no new tuple) gives None."""
    rng = random.Random("pgwire-messages")
    for n in range(400):
        infos = [rng.choice(_infos()) for _ in range(rng.randint(1, 8))]
        key = sorted(rng.sample(range(len(infos)), rng.randint(1, len(infos))))
        writer = RowWriter(rng.choice(["public.t", "s.é😀", ""]), infos, key)
        new, old = _row(rng, infos), _row(rng, infos)
        keyed = tuple(d if i in key else None for i, d in enumerate(old))
        oid = struct.pack(">I", rng.randrange(2**32))
        messages = [
            b"I" + oid + b"N" + tuple_data(new),
            b"U" + oid + b"N" + tuple_data(new),
            b"U" + oid + b"K" + tuple_data(keyed) + b"N" + tuple_data(new),
            b"U" + oid + b"O" + tuple_data(old) + b"N" + tuple_data(new),
            b"D" + oid + b"K" + tuple_data(keyed),
            b"D" + oid + b"O" + tuple_data(old),
        ]
        for payload in messages:
            assert writer.from_message(payload) == _generic(writer, payload), (n, payload)
        i = rng.randrange(len(infos))
        odd: list[tuple[object, ...]] = [
            (*new[:i], UNCHANGED, *new[i + 1 :]),
            (*new[:i], b"\x00", *new[i + 1 :]),
            (*new, "1"),
            new[:-1],
        ]
        for image in odd:
            assert writer.from_message(b"I" + oid + b"N" + tuple_data(image)) is None
            assert (
                writer.from_message(b"U" + oid + b"O" + tuple_data(image) + b"N" + tuple_data(new))
                is None
            )
            assert writer.from_message(b"D" + oid + b"O" + tuple_data(image)) is None
        whole = messages[3]
        for cut in (5, 6, 8, len(whole) - 1):
            assert writer.from_message(whole[:cut]) is None
        assert writer.from_message(b"I" + oid + b"K" + tuple_data(new)) is None
        assert writer.from_message(b"U" + oid + b"O" + tuple_data(old)) is None
        assert writer.from_message(b"D" + oid + b"N" + tuple_data(old)) is None


def test_an_encoded_append_logs_the_bytes_of_the_entry(tmp_path: Path) -> None:
    """Publication.append_encoded logs the very bytes append logs for the same Entry
    (origin given or the node's, sequence positions or none), and so does it through
    a publication's shaping; so does append_encoded_many for runs of them (a backlog's
    entries appended together), as consecutive seqs."""
    rng = random.Random("pgwire-append")
    infos = _infos()
    writer = RowWriter("t", infos, [0])
    shaped = PublicationConfig(name="s", tables=["t"], filter={"t": "1 = 1"})
    for config in (PublicationConfig(name="p", tables=["t"]), shaped):
        a = Publication(config, open_log(tmp_path / f"{config.name}-a"), node="n1")
        b = Publication(config, open_log(tmp_path / f"{config.name}-b"), node="n1")
        c = Publication(config, open_log(tmp_path / f"{config.name}-c"), node="n1")
        run: list[tuple[bytes, int, int, str, list[pb.SequencePosition]]] = []
        schema = pb.TableSchema(
            table="t",
            columns=[i.column(f"c{n}", True) for n, i in enumerate(infos)],
            primary_key=["c0"],
        )
        for pub in (a, b, c):
            pub.append(pb.Entry(commit_time_us=1, ops=[pb.Op(schema=schema)]), 1)
        for n in range(30):
            ops = [writer.insert((str(n), *_row(rng, infos)[1:])) for _ in range(rng.randint(1, 4))]
            origin = rng.choice(["", "other"])
            seqs = [pb.SequencePosition(table="t", column="c0", last_value=n)] * rng.randint(0, 2)
            entry = entry_of(ops)
            entry.commit_time_us, entry.origin = 1_700_000_000_000_000 + n, origin
            entry.sequences.extend(seqs)
            a.append(entry, 100 + n, wait=False)
            b.append_encoded(
                framed(ops),
                100 + n,
                commit_time_us=entry.commit_time_us,
                origin=origin,
                sequences=seqs,
                wait=False,
            )
            run.append((framed(ops), 100 + n, entry.commit_time_us, origin, seqs))
            if rng.random() < 0.3 or n == 29:
                first = c.append_encoded_many(run)
                assert first == n + 3 - len(run)  # entry n is seq n + 2 (the schema is 1)
                run = []
        for pub in (a, b, c):
            pub.log.flush()
        assert a.log.read(1, max_entries=100) == b.log.read(1, max_entries=100)
        assert a.log.read(1, max_entries=100) == c.log.read(1, max_entries=100)
        assert a.position == b.position == c.position == 129
        for pub in (a, b, c):
            pub.log.close()
