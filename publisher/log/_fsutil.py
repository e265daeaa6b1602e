"""File-system helpers: durable small-file writes and directory fsync."""

from __future__ import annotations

import os
from pathlib import Path

from ._framing import TMP_SUFFIX


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (creations, renames, unlinks) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write every byte of ``data`` to ``fd`` at ``offset``."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def atomic_write(path: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Write ``path`` as tmp → fsync → rename → fsync dir, so it is whole or absent."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)
