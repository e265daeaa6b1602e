"""Opening a log after crashes and damage: torn tails, corruption, temp files, and the
index cache (missing, stale, garbage) — plus the framing primitives themselves."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Literal

import pytest
from structlog.testing import capture_logs

from publisher.log import CorruptLogError, Log, open_log
from publisher.log._framing import (
    INDEX_INTERVAL,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    decode_record_header,
    decode_segment_header,
    encode_record,
    encode_records,
    encode_segment_header,
    index_name,
    parse_segment_name,
    segment_name,
)
from publisher.log._index import decode_index, encode_index, load_index

SEG = 4096


def payload(seq: int, size: int = 100) -> bytes:
    return (f"{seq}:".encode() * size)[:size]


def make_log(d: Path, n: int, size: int = 100) -> list[Path]:
    """Write n entries in small segments; return the segment paths, oldest first."""
    with open_log(d, segment_bytes=SEG) as lg:
        for s in range(1, n + 1):
            lg.append([payload(s, size)])
    return sorted(d.glob("*.seg"))


def read_all(lg: Log) -> list[bytes]:
    out: list[bytes] = []
    seq = lg.first_seq
    while seq <= lg.head:
        got = lg.read(seq, max_entries=10_000, max_bytes=1 << 30)
        out += got
        seq += len(got)
    return out


def record_offsets(path: Path) -> list[int]:
    """Offsets of the records in a segment file, found by walking the framing."""
    data = path.read_bytes()
    off = SEGMENT_HEADER_SIZE
    offs = []
    while off < len(data):
        hdr = decode_record_header(data, off)
        assert hdr is not None
        offs.append(off)
        off += RECORD_HEADER_SIZE + hdr.length
    return offs


# -- framing -------------------------------------------------------------------


def test_record_layout_is_as_documented():
    """A record is magic, length, seq, CRC over header prefix + payload, then payload."""
    rec = encode_record(7, b"hello")
    assert rec[:4] == b"TXRE"
    assert int.from_bytes(rec[4:8], "big") == 5
    assert int.from_bytes(rec[8:16], "big") == 7
    assert int.from_bytes(rec[16:20], "big") == zlib.crc32(b"hello", zlib.crc32(rec[:16]))
    assert rec[20:] == b"hello"
    hdr = decode_record_header(rec, 0)
    assert hdr is not None
    assert (hdr.length, hdr.seq) == (5, 7)


def test_encode_records_matches_single_records():
    """Batch framing is the concatenation of single records, with correct offsets."""
    items = [b"a", b"", b"ccc"]
    data, starts = encode_records(10, items)
    singles = [encode_record(10 + i, p) for i, p in enumerate(items)]
    assert data == b"".join(singles)
    assert starts == [0, len(singles[0]), len(singles[0]) + len(singles[1])]


def test_segment_header_and_names():
    """Segment names are 20-digit first seqs; headers round-trip and reject garbage."""
    assert segment_name(1) == "00000000000000000001.seg"
    assert index_name(42) == "00000000000000000042.idx"
    assert parse_segment_name(segment_name(123456)) == 123456
    assert sorted(segment_name(s) for s in (10, 9, 100)) == [
        segment_name(9),
        segment_name(10),
        segment_name(100),
    ]
    for bad in ("1.seg", "0000000000000000000x.seg", "00000000000000000000.seg", "a.idx"):
        assert parse_segment_name(bad) is None
    hdr = encode_segment_header(99)
    assert len(hdr) == SEGMENT_HEADER_SIZE
    assert decode_segment_header(hdr) == 99
    assert decode_segment_header(b"XXXX" + hdr[4:]) is None
    assert decode_segment_header(hdr[:10]) is None


def test_index_encoding_round_trip_and_rejections():
    """The index cache decodes only when CRC, first seq, size and interval all agree."""
    from array import array

    offsets = array("Q", [16, 4000, 8000])
    data = encode_index(5, 2 * INDEX_INTERVAL + 1, 9000, offsets)
    assert decode_index(data, 5, 9000) == (2 * INDEX_INTERVAL + 1, offsets)
    assert decode_index(data, 6, 9000) is None  # another segment
    assert decode_index(data, 5, 9001) is None  # segment changed size
    flipped = bytearray(data)
    flipped[45] ^= 1
    assert decode_index(bytes(flipped), 5, 9000) is None
    assert decode_index(data[:-1], 5, 9000) is None
    assert decode_index(b"", 5, 9000) is None


# -- torn tails ---------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, RECORD_HEADER_SIZE - 1, RECORD_HEADER_SIZE, 50])
def test_torn_tail_is_saved_aside_and_truncated(tmp_path: Path, cut: int):
    """A partial last record is copied to .torn-<offset>, cut off, and warned about."""
    d = tmp_path / "pub"
    segs = make_log(d, 100)
    last = segs[-1]
    good_size = last.stat().st_size
    partial = encode_record(101, payload(101))[:cut]
    with last.open("ab") as f:
        f.write(partial)
    with capture_logs() as logs, open_log(d, segment_bytes=SEG) as lg:
        assert lg.head == 100
        assert read_all(lg) == [payload(s) for s in range(1, 101)]
        assert lg.append([b"after"]) == 101
        assert lg.read(101) == [b"after"]
    torn = last.with_name(f"{last.name}.torn-{good_size}")
    assert torn.read_bytes() == partial
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["start"] == good_size
    assert warnings[0]["end"] == good_size + cut
    assert warnings[0]["segment"] == str(last)


def test_zero_filled_tail_is_torn(tmp_path: Path):
    """Zeros after the last record (file extended, data never written) are a torn tail."""
    d = tmp_path / "pub"
    last = make_log(d, 50)[-1]
    with last.open("ab") as f:
        f.write(b"\x00" * 3000)
    with open_log(d, segment_bytes=SEG) as lg:
        assert lg.head == 50


def test_corrupt_last_record_is_treated_as_torn(tmp_path: Path):
    """A bad CRC in the very last record cannot be told from a torn append: cut it."""
    d = tmp_path / "pub"
    last = make_log(d, 50)[-1]
    offs = record_offsets(last)
    data = bytearray(last.read_bytes())
    data[offs[-1] + RECORD_HEADER_SIZE + 3] ^= 0xFF
    last.write_bytes(bytes(data))
    with open_log(d, segment_bytes=SEG) as lg:
        assert lg.head == 49
        assert read_all(lg) == [payload(s) for s in range(1, 50)]


def test_repeated_torn_tails_keep_every_copy(tmp_path: Path):
    """Two torn tails at the same offset are both kept aside."""
    d = tmp_path / "pub"
    last = make_log(d, 10)[-1]
    size = last.stat().st_size
    for junk in (b"TXRE\x00", b"TXRE\x01"):
        with last.open("ab") as f:
            f.write(junk)
        open_log(d).close()
    assert len(list(d.glob(f"{last.name}.torn-{size}*"))) == 2


# -- corruption refused --------------------------------------------------------


def test_bad_crc_mid_last_segment_refuses_open(tmp_path: Path):
    """Damage followed by valid records is not a torn tail: refuse, naming file and offset."""
    d = tmp_path / "pub"
    last = make_log(d, 100)[-1]
    offs = record_offsets(last)
    assert len(offs) > 3
    data = bytearray(last.read_bytes())
    data[offs[1] + RECORD_HEADER_SIZE + 1] ^= 0x01
    last.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as info:
        open_log(d)
    assert info.value.path == last
    assert info.value.offset == offs[1]
    assert str(last) in str(info.value)


def test_bad_crc_in_sealed_segment_refuses_open(tmp_path: Path):
    """Any damage in a sealed segment refuses to open, naming the file and offset."""
    d = tmp_path / "pub"
    first = make_log(d, 100)[0]
    offs = record_offsets(first)
    data = bytearray(first.read_bytes())
    data[offs[-1] + 25] ^= 0x10  # even the last record of a sealed segment
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as info:
        open_log(d)
    assert (info.value.path, info.value.offset) == (first, offs[-1])


def test_truncated_sealed_segment_refuses_open(tmp_path: Path):
    """A sealed segment cut short (a lost tail of a non-last segment) is corruption."""
    d = tmp_path / "pub"
    first = make_log(d, 100)[0]
    os.truncate(first, first.stat().st_size - 5)
    with pytest.raises(CorruptLogError) as info:
        open_log(d)
    assert info.value.path == first


def test_missing_middle_segment_is_a_seq_gap(tmp_path: Path):
    """A deleted middle segment leaves a seq gap: refuse, naming the next segment."""
    d = tmp_path / "pub"
    segs = make_log(d, 200)
    segs[1].unlink()
    with pytest.raises(CorruptLogError) as info:
        open_log(d)
    assert info.value.path == segs[2]
    assert "gap" in str(info.value)


def test_bad_segment_header_refuses_open(tmp_path: Path):
    """A segment whose header disagrees with its name is refused at offset 0."""
    d = tmp_path / "pub"
    segs = make_log(d, 200)
    data = bytearray(segs[1].read_bytes())
    data[15] ^= 1  # first seq in the header
    segs[1].write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as info:
        open_log(d)
    assert (info.value.path, info.value.offset) == (segs[1], 0)


def test_unreadable_segment_refuses_open(tmp_path: Path):
    """A segment that is not a readable file (here a directory) is refused."""
    d = tmp_path / "pub"
    segs = make_log(d, 200)
    segs[1].unlink()
    segs[1].mkdir()
    with pytest.raises(CorruptLogError) as info:
        open_log(d)
    assert info.value.path == segs[1]


def test_corruption_behind_trusted_index_is_caught_on_read(tmp_path: Path):
    """With verify="tail" sealed segments are not rescanned, but reads still check CRCs."""
    d = tmp_path / "pub"
    first = make_log(d, 200)[0]
    offs = record_offsets(first)
    data = bytearray(first.read_bytes())
    data[offs[2] + RECORD_HEADER_SIZE] ^= 0x40
    first.write_bytes(bytes(data))
    with open_log(d, verify="tail") as lg:
        assert lg.read(1, max_entries=2) == [payload(1), payload(2)]
        with pytest.raises(CorruptLogError) as info:
            lg.read(1)
        assert (info.value.path, info.value.offset) == (first, offs[2])
        with pytest.raises(CorruptLogError):
            lg.read(3)
    with pytest.raises(CorruptLogError):
        open_log(d)  # the default full verification refuses outright


# -- temp files and the index cache --------------------------------------------


def test_temp_files_and_orphan_indexes_are_removed(tmp_path: Path):
    """Leftover *.tmp files and indexes of purged segments are deleted on open."""
    d = tmp_path / "pub"
    make_log(d, 20)
    (d / "INCARNATION.tmp").write_bytes(b"half")
    (d / (segment_name(999) + ".tmp")).write_bytes(b"x")
    (d / index_name(999)).write_bytes(b"orphan")
    with open_log(d) as lg:
        assert lg.head == 20
    assert not list(d.glob("*.tmp"))
    assert not (d / index_name(999)).exists()


@pytest.mark.parametrize("damage", ["missing", "garbage", "stale", "truncated"])
@pytest.mark.parametrize("verify", ["full", "tail"])
def test_index_is_only_a_cache(tmp_path: Path, damage: str, verify: Literal["full", "tail"]):
    """Missing, garbage, stale or truncated index files are rebuilt; reads stay right."""
    d = tmp_path / "pub"
    segs = make_log(d, 300)
    idx = [s.with_suffix(".idx") for s in segs[:-1]]
    good = [p.read_bytes() for p in idx]
    for p in idx:
        if damage == "missing":
            p.unlink()
        elif damage == "garbage":
            p.write_bytes(os.urandom(200))
        elif damage == "stale":
            # A valid index of another segment: CRC fine, contents wrong.
            p.write_bytes(good[0] if p != idx[0] else good[1])
        else:
            p.write_bytes(p.read_bytes()[:-9])
    with open_log(d, verify=verify) as lg:
        assert read_all(lg) == [payload(s) for s in range(1, 301)]
        for s in (1, 31, 32, 33, 64, 65, 150, 299, 300):
            assert lg.read(s, max_entries=1) == [payload(s)]
    assert [p.read_bytes() for p in idx] == good
    for p, seg in zip(idx, segs, strict=False):
        first = parse_segment_name(seg.name)
        assert first is not None
        assert load_index(p, first, seg.stat().st_size) is not None


def test_creation_interrupted_before_incarnation(tmp_path: Path):
    """A crash between creating the first segment and INCARNATION leaves a fresh log."""
    d = tmp_path / "pub"
    open_log(d).close()
    (d / "INCARNATION").unlink()
    with open_log(d) as lg:
        assert lg.head == 0
        assert lg.append([b"a"]) == 1
