"""How a Sync stream ends, on the wire: refusal and cut kinds (proto enums).

The publisher ends a Sync it refuses, or a feed it cuts, with a gRPC status
(code + a message for people) and, in the trailing metadata, the *kind*: the
name of a :data:`RefusalKind` or :data:`CutKind` value (proto/txrepl/v1)::

    refused before Welcome:  code = REFUSAL_CODES[kind]
                             trailing metadata  txrepl-refusal-kind: REFUSAL_KIND_INVALID
    cut after Welcome:       code = ABORTED, details "feed cut: <reason>"
                             trailing metadata  txrepl-cut-kind: CUT_KIND_SEND_TIMEOUT

Programs read the kind, people read the message: the subscriber classifies a
refusal by its kind (subscriber.stream), the publisher labels its cut metric by
the kind (:func:`cut_label`); nothing matches message text.  A missing or
unknown value reads as ``*_UNSPECIFIED`` (a refusal from outside the feed, such
as the authentication interceptor, or a newer peer): the status code decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

import grpc

from common.rpc import txrepl_pb2 as pb

__all__ = [
    "CUT_KEY",
    "CUT_PREFIX",
    "REFUSAL_CODES",
    "REFUSAL_KEY",
    "CutKind",
    "RefusalKind",
    "cut_kind",
    "cut_kind_from_label",
    "cut_label",
    "cut_metadata",
    "refusal_kind",
    "refusal_metadata",
]

RefusalKind: TypeAlias = pb.RefusalKind.ValueType
CutKind: TypeAlias = pb.CutKind.ValueType

REFUSAL_KEY = "txrepl-refusal-kind"
CUT_KEY = "txrepl-cut-kind"
CUT_PREFIX = "feed cut"  # the details of a cut: f"{CUT_PREFIX}: {reason}"

# The status code each refusal ends the stream with (documented in the proto);
# UNSPECIFIED has none of its own.
REFUSAL_CODES: dict[RefusalKind, grpc.StatusCode] = {
    pb.REFUSAL_KIND_MALFORMED: grpc.StatusCode.INVALID_ARGUMENT,
    pb.REFUSAL_KIND_HELLO_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    pb.REFUSAL_KIND_WRONG_PUBLISHER: grpc.StatusCode.FAILED_PRECONDITION,
    pb.REFUSAL_KIND_UNKNOWN_PUBLICATION: grpc.StatusCode.NOT_FOUND,
    pb.REFUSAL_KIND_UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    pb.REFUSAL_KIND_PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    pb.REFUSAL_KIND_INCARNATION_CHANGED: grpc.StatusCode.FAILED_PRECONDITION,
    pb.REFUSAL_KIND_AHEAD_OF_HEAD: grpc.StatusCode.OUT_OF_RANGE,
    pb.REFUSAL_KIND_SNAPSHOT_REQUIRED: grpc.StatusCode.FAILED_PRECONDITION,
    pb.REFUSAL_KIND_INVALID: grpc.StatusCode.FAILED_PRECONDITION,
}

_CUT_PREFIX = "CUT_KIND_"
_OTHER = "other"  # the label of CUT_KIND_UNSPECIFIED


def refusal_metadata(kind: RefusalKind) -> tuple[tuple[str, str]]:
    """The trailing metadata that carries ``kind``."""
    return ((REFUSAL_KEY, pb.RefusalKind.Name(kind)),)


def cut_metadata(kind: CutKind) -> tuple[tuple[str, str]]:
    """The trailing metadata that carries ``kind``."""
    return ((CUT_KEY, pb.CutKind.Name(kind)),)


def _name(
    metadata: Iterable[tuple[str, str | bytes]] | None, key: str, known: Iterable[str]
) -> str:
    """The value of ``key`` if it is one of the ``known`` names, else ''."""
    for k, v in metadata or ():
        if k == key:
            name = v.decode("ascii", "replace") if isinstance(v, bytes) else v
            return name if name in known else ""
    return ""


def refusal_kind(metadata: Iterable[tuple[str, str | bytes]] | None) -> RefusalKind:
    """The refusal kind in a stream's trailing metadata; UNSPECIFIED if none or unknown."""
    name = _name(metadata, REFUSAL_KEY, pb.RefusalKind.keys())
    return pb.RefusalKind.Value(name) if name else pb.REFUSAL_KIND_UNSPECIFIED


def cut_kind(metadata: Iterable[tuple[str, str | bytes]] | None) -> CutKind:
    """The cut kind in a stream's trailing metadata; UNSPECIFIED if none or unknown."""
    name = _name(metadata, CUT_KEY, pb.CutKind.keys())
    return pb.CutKind.Value(name) if name else pb.CUT_KIND_UNSPECIFIED


def cut_label(kind: CutKind) -> str:
    """The metric label of a cut kind: ``CUT_KIND_SEND_TIMEOUT`` → ``send_timeout``."""
    if kind == pb.CUT_KIND_UNSPECIFIED:
        return _OTHER
    return pb.CutKind.Name(kind).removeprefix(_CUT_PREFIX).lower()


def cut_kind_from_label(label: str) -> CutKind:
    """The inverse of :func:`cut_label` (UNSPECIFIED for ``other`` or an unknown label)."""
    if label == _OTHER:
        return pb.CUT_KIND_UNSPECIFIED
    try:
        return pb.CutKind.Value(_CUT_PREFIX + label.upper())
    except ValueError:
        return pb.CUT_KIND_UNSPECIFIED
