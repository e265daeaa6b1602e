"""Opening a log directory: lock it, recover its segments, or create a new log.

Recovery (``_recover``) removes temp files and index files left by an
interrupted purge, recovers every segment (a torn tail of the last one is saved
aside by ``_segment``), refuses seq gaps, rewrites missing index caches of
sealed segments, and reads or creates the ``INCARNATION`` file.  A new log gets
a fresh incarnation UUID written atomically (tmp, fsync, rename, fsync dir).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from pathlib import Path
from typing import Literal

import structlog

from ._framing import (
    INCARNATION_NAME,
    INDEX_SUFFIX,
    LOCK_NAME,
    TMP_SUFFIX,
    encode_incarnation,
    index_name,
    parse_segment_name,
)
from ._fsutil import atomic_write, fsync_dir
from ._index import load_index
from ._log import FsyncPolicy, Log
from ._segment import Segment, create_segment, recover_segment
from .errors import CorruptLogError, LogError, LogLockedError

__all__ = ["open_log"]

logger = structlog.get_logger(__name__)


def open_log(
    directory: Path,
    *,
    fsync: FsyncPolicy = "always",
    fsync_interval_ms: int = 10,
    segment_bytes: int = 64 * 1024 * 1024,
    create: bool = True,
    verify: Literal["full", "tail"] = "full",
) -> Log:
    """Open (recovering) or create the log in ``directory``.

    ``verify="full"`` checks every record of every segment (CRC and seq) before
    opening; ``"tail"`` trusts valid index caches of sealed segments and scans only
    the last segment (and sealed segments without a valid index).  Raises
    CorruptLogError (file and offset) if damage other than a torn tail is found.
    """
    if fsync not in ("always", "interval"):
        raise ValueError(f"fsync must be 'always' or 'interval', not {fsync!r}")
    if fsync_interval_ms < 1:
        raise ValueError("fsync_interval_ms must be at least 1")
    if segment_bytes < 4096:
        raise ValueError("segment_bytes must be at least 4096")
    directory = Path(directory)
    if not directory.is_dir():
        if not create:
            raise LogError("log directory does not exist", directory)
        directory.mkdir(parents=True, exist_ok=True)
        fsync_dir(directory.parent)
    lock_fd = _lock_directory(directory)
    try:
        segments, incarnation = _recover(directory, trust_index=verify == "tail", create=create)
        return Log(
            directory,
            incarnation=incarnation,
            segments=segments,
            lock_fd=lock_fd,
            fsync=fsync,
            fsync_interval_ms=fsync_interval_ms,
            segment_bytes=segment_bytes,
        )
    except BaseException:
        os.close(lock_fd)
        raise


def _lock_directory(directory: Path) -> int:
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise LogLockedError("log is open in another process", directory) from exc
    return fd


def _recover(directory: Path, *, trust_index: bool, create: bool) -> tuple[list[Segment], str]:
    removed = False
    firsts: list[int] = []
    for entry in os.scandir(directory):
        if entry.name.endswith(TMP_SUFFIX):
            os.unlink(entry.path)
            removed = True
            logger.info("log removed temp file", path=entry.path)
            continue
        seq = parse_segment_name(entry.name)
        if seq is not None:
            firsts.append(seq)
    firsts.sort()
    live = {index_name(f) for f in firsts}
    for entry in os.scandir(directory):
        if entry.name.endswith(INDEX_SUFFIX) and entry.name not in live:
            os.unlink(entry.path)  # left by a purge interrupted by a crash
            removed = True
    if removed:
        fsync_dir(directory)

    inc_path = directory / INCARNATION_NAME
    segments: list[Segment] = []
    for i, first in enumerate(firsts):
        last = i == len(firsts) - 1
        seg = recover_segment(directory, first, last=last, trust_index=trust_index)
        if segments and seg.first_seq != segments[-1].last_seq + 1:
            raise CorruptLogError(
                f"seq gap: previous segment ends at seq {segments[-1].last_seq}",
                seg.path,
                0,
            )
        segments.append(seg)
    for seg in segments[:-1]:
        if load_index(seg.index_path, seg.first_seq, seg.size) is None:
            try:
                seg.save_index()
            except OSError as exc:
                logger.warning("log index not written", path=str(seg.index_path), error=str(exc))

    if inc_path.exists():
        incarnation = _read_incarnation(inc_path)
        if not segments:
            raise CorruptLogError("log has an incarnation but no segment", directory)
        return segments, incarnation
    if any(s.count for s in segments):
        raise CorruptLogError("log has entries but no INCARNATION file", inc_path)
    if not create:
        raise LogError("no log in directory (and create=False)", directory)
    # A new log (or one whose creation a crash interrupted before any entry).
    if not segments:
        segments.append(create_segment(directory, 1))
    incarnation = str(uuid.uuid4())
    atomic_write(inc_path, encode_incarnation(incarnation))
    logger.info("log created", directory=str(directory), incarnation=incarnation)
    return segments, incarnation


def _read_incarnation(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorruptLogError(f"cannot read incarnation: {exc.strerror}", path, 0) from exc
    try:
        text = data.decode("ascii")
        value = str(uuid.UUID(text.strip()))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptLogError("INCARNATION is not a UUID", path, 0) from exc
    if data != encode_incarnation(value):
        raise CorruptLogError("INCARNATION is not in canonical form", path, 0)
    return value
