"""Errors raised by the publication log (a branch of publisher.errors' tree).

::

    TxreplError > PublisherError    (common.errors, publisher.errors)
    └── LogError                    any failure of the log; carries path (and offset)
        ├── CorruptLogError         damaged bytes (bad CRC, seq gap, bad header, unreadable
        │                           file) at path/offset: the log refuses to open, or a read
        │                           refuses to return the entry.  Permanent (also
        │                           common.errors.PermanentError): an operator must intervene.
        ├── PurgedError             read below first_seq: the entries were removed by
        │                           retention.  Carries the seq asked for and first_seq.
        ├── LogClosedError          the Log was used after close().
        ├── LogLockedError          another process holds the log directory open.
        └── LogFailedError          an fsync or write failed; the log stops accepting
                                    appends (the page cache can no longer be trusted)
                                    until reopened.  Also PermanentError.

Foreign errors (OSError from the file system) are translated into these at the
boundary of the log, with the path and the OS error chained as ``__cause__``.
"""

from __future__ import annotations

from pathlib import Path

from common.errors import PermanentError
from publisher.errors import PublisherError

__all__ = [
    "CorruptLogError",
    "LogClosedError",
    "LogError",
    "LogFailedError",
    "LogLockedError",
    "PurgedError",
]


class LogError(PublisherError):
    """A failure of the publication log at ``path`` (and ``offset`` when known)."""

    def __init__(self, message: str, path: Path | None = None, offset: int | None = None) -> None:
        self.message = message
        self.path = path
        self.offset = offset
        super().__init__(message, path, offset)

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = f" [{self.path}"
            where += f" at offset {self.offset}]" if self.offset is not None else "]"
        return f"{self.message}{where}"


class CorruptLogError(LogError, PermanentError):
    """Damaged bytes at ``path``/``offset`` that recovery must not paper over."""


class PurgedError(LogError):
    """``seq`` was asked for but retention already removed everything below ``first_seq``."""

    def __init__(self, path: Path, seq: int, first_seq: int) -> None:
        self.seq = seq
        self.first_seq = first_seq
        super().__init__(f"seq {seq} was purged; first retained seq is {first_seq}", path)
        self.args = (path, seq, first_seq)


class LogClosedError(LogError):
    """The log was used after ``close()``."""


class LogLockedError(LogError):
    """Another process has the log directory open."""


class LogFailedError(LogError, PermanentError):
    """A write or fsync failed; the log accepts no more appends until it is reopened."""
