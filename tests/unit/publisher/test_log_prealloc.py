"""The active segment's preallocated space (publisher/log/_framing.py, "Preallocated
space"): small rounds overwrite zeros written ahead instead of growing the file, and
opening tells those zeros, and a crashed round's missing pages, from corruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from publisher.log import CorruptLogError, open_log
from publisher.log._framing import (
    PREALLOC_BYTES,
    RECORD_HEADER_SIZE,
    ZERO_BLOCK,
    encode_record,
)

REPO = Path(__file__).resolve().parents[3]


def payload(seq: int, size: int = 100) -> bytes:
    return (f"{seq}:".encode() * size)[:size]


def only_segment(d: Path) -> Path:
    (seg,) = d.glob("*.seg")
    return seg


def test_small_appends_do_not_grow_the_file_each_round(tmp_path: Path):
    """In-sync appends (one small entry per fsync) change the file's size once per
    preallocated stretch, so their fdatasync has no new size to journal."""
    d = tmp_path / "pub"
    with open_log(d) as lg:
        lg.append([payload(1)])
        seg = only_segment(d)
        size = seg.stat().st_size
        for s in range(2, 501):
            lg.append([payload(s)])
            assert seg.stat().st_size == size
        assert size >= PREALLOC_BYTES
    # Closed cleanly: no zeros left, the file ends at its last record (older code reads
    # it as it always did).
    assert seg.stat().st_size == 16 + 500 * (RECORD_HEADER_SIZE + 100)


def test_a_killed_writer_leaves_zeros_that_open_trims_quietly(tmp_path: Path):
    """After a SIGKILL the zeros written ahead are trimmed at open: every entry appended
    is there, no ``.torn-`` file is made and nothing is warned about."""
    d = tmp_path / "pub"
    child = (
        "import sys\n"
        "from pathlib import Path\n"
        "from publisher.log import open_log\n"
        "lg = open_log(Path(sys.argv[1]))\n"
        "for s in range(1, 201):\n"
        "    lg.append([(f'{s}:'.encode() * 100)[:100]])\n"
        "print('DONE', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(d)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # the log's own lines come first (structlog to stdout)
        if line.strip() == "DONE":
            break
    else:
        pytest.fail("the writer ended before appending everything")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    seg = only_segment(d)
    assert seg.stat().st_size > 16 + 200 * (RECORD_HEADER_SIZE + 100)  # zeros follow
    with capture_logs() as logs, open_log(d) as lg:
        assert lg.head == 200
        assert lg.read(1, max_entries=200) == [payload(s) for s in range(1, 201)]
        assert lg.append([b"after"]) == 201
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []
    assert list(d.glob("*.torn-*")) == []
    with open_log(d) as lg:
        assert lg.read(201) == [b"after"]


def _records_then(d: Path, n: int, tail: bytes) -> tuple[Path, int]:
    """A closed log of ``n`` entries whose segment is followed by ``tail``; returns the
    segment and the offset where ``tail`` begins."""
    with open_log(d) as lg:
        for s in range(1, n + 1):
            lg.append([payload(s)])
    seg = only_segment(d)
    end = seg.stat().st_size
    with seg.open("ab") as f:
        f.write(tail)
    return seg, end


def test_a_torn_round_before_the_zeros_is_saved_aside(tmp_path: Path):
    """A partial record followed by preallocated zeros is a torn tail: the partial bytes
    (not the zeros) are kept aside and cut, with a warning."""
    d = tmp_path / "pub"
    partial = encode_record(11, payload(11))[:50]
    seg, end = _records_then(d, 10, partial + bytes(PREALLOC_BYTES))
    with capture_logs() as logs, open_log(d) as lg:
        assert lg.head == 10
    assert seg.with_name(f"{seg.name}.torn-{end}").read_bytes() == partial
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["log torn tail truncated"]


def test_a_crashed_rounds_missing_page_before_its_later_records_is_torn(tmp_path: Path):
    """An OS crash during a round can leave its later pages on disk and an earlier one
    as preallocated zeros: the records after that hole were never durable, so the log
    opens without them (kept aside) instead of refusing as corrupt."""
    d = tmp_path / "pub"
    hole = bytes(2 * ZERO_BLOCK)
    later = encode_record(12, payload(12))
    seg, end = _records_then(d, 10, hole + later + bytes(ZERO_BLOCK))
    with open_log(d) as lg:
        assert lg.head == 10
        assert lg.read(1, max_entries=20) == [payload(s) for s in range(1, 11)]
    assert seg.with_name(f"{seg.name}.torn-{end}").read_bytes() == hole + later


@pytest.mark.parametrize("junk", [b"\x01" * (2 * ZERO_BLOCK), b"\x00" * (ZERO_BLOCK - 1)])
def test_damage_without_a_zero_block_before_a_valid_record_still_refuses(
    tmp_path: Path, junk: bytes
):
    """Damage that no missing page explains (no whole aligned block of zeros), followed
    by a valid record, is corruption: refused, naming the file and offset."""
    d = tmp_path / "pub"
    seg, end = _records_then(d, 10, junk + encode_record(12, payload(12)) + bytes(100))
    with pytest.raises(CorruptLogError) as info:
        open_log(d)
    assert info.value.path == seg
    assert info.value.offset == end


def test_no_room_for_the_zeros_still_appends(tmp_path: Path):
    """A file-size limit (as a full disk) that leaves no room for the zeros written
    ahead fails no append: the records go in, segments roll, and the log reopens with
    every entry and no zeros in its sealed segments."""
    d = tmp_path / "pub"
    child = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from publisher.log import open_log\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))\n"
        "with open_log(Path(sys.argv[1]), segment_bytes=64 * 1024) as lg:\n"
        "    for s in range(1, 1501):\n"
        "        lg.append([(f'{s}:'.encode() * 100)[:100]])\n"
    )
    subprocess.run(
        [sys.executable, "-c", child, str(d)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        capture_output=True,
    )
    segs = sorted(d.glob("*.seg"))
    assert len(segs) > 1
    with open_log(d) as lg:
        assert lg.read(1, max_entries=2000) == [payload(s) for s in range(1, 1501)]
        for seg in lg._segments[:-1]:
            assert seg.path.stat().st_size == seg.size
