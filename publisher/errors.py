"""Publisher errors.

    PublisherError                 base; carries a message an operator can act on
    ├── SourceError                the source database refuses or lacks something
    │                              (missing table, no primary key, wal_level)
    └── FeedRefused                a sync request is refused; carries the gRPC code
                                   the feed ends with (NOT_FOUND, FAILED_PRECONDITION,
                                   OUT_OF_RANGE, PERMISSION_DENIED, INVALID_ARGUMENT)
                                   and the RefusalKind sent with it (common.feedstatus)

Log errors live in publisher.log (LogError, CorruptLogError, PurgedError).
"""

from __future__ import annotations

import grpc

from common.feedstatus import RefusalKind
from common.rpc import txrepl_pb2 as pb

__all__ = ["FeedRefused", "PublisherError", "SourceError"]


class PublisherError(Exception):
    """Base of the publisher's own errors."""


class SourceError(PublisherError):
    """The source database cannot be captured as configured."""


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
