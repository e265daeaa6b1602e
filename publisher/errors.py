"""Publisher errors, rooted at :class:`common.errors.TxreplError`.

::

    TxreplError                       common.errors
    └── PublisherError                base; carries a message an operator can act on
        ├── SourceError               the source database refuses or lacks something
        │   │                         (missing table, no primary key, wal_level)
        │   ├── TableRefused          one table cannot be replicated (no primary key, a
        │   │                         column type that cannot be carried): carries the
        │   │                         table; the publisher serves the others
        │   ├── ProtocolError         a logical decoding message cannot be parsed
        │   │                         (publisher.capture.postgres)
        │   ├── RowTooLarge           one row change is over max_entry_bytes: carries
        │   │                         the publication, table and key; that publication's
        │   │                         capture stops, the others go on
        │   └── ShapeRefused          a publication's filter or column list names what
        │                             the table lacks, or cannot be evaluated
        │                             (publisher/shaping.py)
        ├── FeedRefused               a sync request is refused; carries the gRPC code
        │                             the feed ends with (NOT_FOUND, FAILED_PRECONDITION,
        │                             OUT_OF_RANGE, PERMISSION_DENIED, INVALID_ARGUMENT)
        │                             and the RefusalKind sent with it (common.feedstatus)
        └── LogError                  publisher.log.errors: any failure of a publication
            ├── CorruptLogError       log (path, offset); CorruptLogError and
            ├── PurgedError           LogFailedError are also common.errors.PermanentError
            ├── LogClosedError
            ├── LogLockedError
            └── LogFailedError

Capture retries failures of a reachable source itself (publisher.capture); a
SourceError raised at start-up stops the publisher with its message.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from common import values
from common.errors import TxreplError
from common.feedstatus import RefusalKind
from common.rpc import txrepl_pb2 as pb

__all__ = [
    "FeedRefused",
    "ProtocolError",
    "PublisherError",
    "RowTooLarge",
    "ShapeRefused",
    "SourceError",
    "TableRefused",
]


class PublisherError(TxreplError):
    """Base of the publisher's own errors."""


class SourceError(PublisherError):
    """The source database cannot be captured as configured."""


class RegistryError(PublisherError):
    """The registry (``registry_url``, SQLite in the data directory by default) cannot
    be opened at start-up."""


class TableRefused(SourceError):
    """One published table cannot be replicated as it is; ``table`` names it."""

    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table


class ProtocolError(SourceError):
    """A logical decoding message (pgoutput, wal2json) that cannot be parsed."""


class RowTooLarge(SourceError):
    """A single row change larger than ``max_entry_bytes``: it fits in no entry."""

    def __init__(self, *, publication: str, table: str, key: str, size: int, limit: int) -> None:
        super().__init__(
            f"publication {publication!r}: a row of table {table!r} with key {key} is "
            f"{size} bytes, over max_entry_bytes = {limit}; its capture stops here "
            "(the other publications go on): raise max_entry_bytes in [publisher] and "
            "restart the publisher"
        )
        self.publication = publication
        self.table = table
        self.key = key


def key_text(rc: pb.RowChange, key_idx: Sequence[int]) -> str:
    """A row change's key as an operator reads it: ``(v1, v2)``, each value cut at 60."""
    vals = list(rc.key) if len(rc.key) else [rc.row[i] for i in key_idx if i < len(rc.row)]
    return "(" + ", ".join(repr(values.decode(v))[:60] for v in vals) + ")"


class FeedRefused(PublisherError):
    """A sync request is refused with ``code``; the message says why and what to do."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        kind: RefusalKind = pb.REFUSAL_KIND_UNSPECIFIED,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind


class ShapeRefused(SourceError):
    """A publication's ``filter`` or ``columns`` cannot be applied to its table."""
