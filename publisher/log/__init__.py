"""The per-publication log: durable, segmented, recoverable storage of entries.

``open_log(directory)`` returns a :class:`Log`; the on-disk format is described in
``publisher/log/_framing.py`` and the exception tree in ``publisher/log/errors.py``.
"""

from ._log import FsyncPolicy, Listener, Log
from ._open import open_log
from .errors import (
    CorruptLogError,
    LogClosedError,
    LogError,
    LogFailedError,
    LogLockedError,
    PurgedError,
)

__all__ = [
    "CorruptLogError",
    "FsyncPolicy",
    "Listener",
    "Log",
    "LogClosedError",
    "LogError",
    "LogFailedError",
    "LogLockedError",
    "PurgedError",
    "open_log",
]
