"""Refusal and cut kinds on the wire: every kind maps both ways, and means one thing."""

from __future__ import annotations

import grpc
import pytest

from common.feedstatus import (
    CUT_KEY,
    REFUSAL_CODES,
    REFUSAL_KEY,
    cut_kind,
    cut_kind_from_label,
    cut_label,
    cut_metadata,
    refusal_kind,
    refusal_metadata,
)
from common.rpc import txrepl_pb2 as pb
from subscriber.errors import (
    FeedEnded,
    InvalidSubscriber,
    PermanentFeedError,
    SnapshotRequired,
)
from subscriber.stream import REFUSALS, classify

REFUSAL_KINDS = list(pb.RefusalKind.values())
CUT_KINDS = list(pb.CutKind.values())
KNOWN_REFUSALS = [k for k in REFUSAL_KINDS if k != pb.REFUSAL_KIND_UNSPECIFIED]


def _raised(code: grpc.StatusCode, details: str, metadata: object) -> BaseException:
    with pytest.raises(Exception) as err:
        classify(code, details, metadata)  # type: ignore[arg-type]
    return err.value


@pytest.mark.parametrize("kind", REFUSAL_KINDS, ids=pb.RefusalKind.Name)
def test_refusal_kind_round_trips_through_trailing_metadata(kind: pb.RefusalKind.ValueType) -> None:
    """A refusal kind written as trailing metadata reads back as the same kind."""
    md = refusal_metadata(kind)
    assert md == ((REFUSAL_KEY, pb.RefusalKind.Name(kind)),)
    assert refusal_kind(md) == kind
    assert refusal_kind([(k, v.encode()) for k, v in md]) == kind  # bytes values too


@pytest.mark.parametrize("kind", CUT_KINDS, ids=pb.CutKind.Name)
def test_cut_kind_round_trips_through_metadata_and_label(kind: pb.CutKind.ValueType) -> None:
    """A cut kind reads back from its trailing metadata and from its metric label."""
    md = cut_metadata(kind)
    assert md == ((CUT_KEY, pb.CutKind.Name(kind)),)
    assert cut_kind(md) == kind
    assert cut_kind_from_label(cut_label(kind)) == kind


def test_cut_labels_are_few_and_distinct() -> None:
    """One label per kind, the kind's name in lower case; 'other' for UNSPECIFIED."""
    labels = [cut_label(k) for k in CUT_KINDS]
    assert len(set(labels)) == len(CUT_KINDS)
    assert sorted(labels) == [
        "other",
        "publisher_shutting_down",
        "purged",
        "queue_threshold",
        "send_timeout",
    ]
    assert cut_kind_from_label("no such label") == pb.CUT_KIND_UNSPECIFIED


def test_missing_or_unknown_kind_reads_as_unspecified() -> None:
    """No metadata, other keys, or a kind from a newer peer: UNSPECIFIED."""
    for md in (None, [], [("other-key", "REFUSAL_KIND_INVALID")], [(REFUSAL_KEY, "NEW_KIND")]):
        assert refusal_kind(md) == pb.REFUSAL_KIND_UNSPECIFIED
    assert cut_kind([(CUT_KEY, "CUT_KIND_FROM_THE_FUTURE")]) == pb.CUT_KIND_UNSPECIFIED


def test_every_refusal_kind_has_a_code_and_a_meaning() -> None:
    """The publisher's code table and the subscriber's classification cover every kind."""
    assert set(REFUSAL_CODES) == set(KNOWN_REFUSALS)
    assert set(REFUSALS) == set(KNOWN_REFUSALS)


@pytest.mark.parametrize("kind", KNOWN_REFUSALS, ids=pb.RefusalKind.Name)
def test_subscriber_classifies_a_refusal_by_its_kind(kind: pb.RefusalKind.ValueType) -> None:
    """The kind decides the error; the message is kept for people."""
    code = REFUSAL_CODES[kind]
    err = _raised(code, "why, and what to do", refusal_metadata(kind))
    assert type(err) is REFUSALS[kind]
    assert "why, and what to do" in str(err)
    if kind not in (pb.REFUSAL_KIND_INVALID, pb.REFUSAL_KIND_SNAPSHOT_REQUIRED):
        # Same outcome as the status code alone gives (a refusal without a kind).
        assert type(_raised(code, "x", None)) is type(err)
        assert str(err) == f"{code.name}: why, and what to do"


def test_kind_not_text_decides() -> None:
    """Message text that looks like a refusal means nothing without the kind."""
    fp = grpc.StatusCode.FAILED_PRECONDITION
    err = _raised(fp, "subscriber is invalid: lagging", None)
    assert type(err) is PermanentFeedError
    err = _raised(fp, "lagging", refusal_metadata(pb.REFUSAL_KIND_INVALID))
    assert type(err) is InvalidSubscriber
    assert str(err) == "lagging"
    err = _raised(fp, "purged", refusal_metadata(pb.REFUSAL_KIND_SNAPSHOT_REQUIRED))
    assert type(err) is SnapshotRequired


def test_cuts_and_transport_errors_are_retried() -> None:
    """A cut (ABORTED) or a lost connection ends in FeedEnded: reconnect with backoff."""
    cut = cut_metadata(pb.CUT_KIND_QUEUE_THRESHOLD)
    assert type(_raised(grpc.StatusCode.ABORTED, "feed cut: queue threshold", cut)) is FeedEnded
    assert type(_raised(grpc.StatusCode.UNAVAILABLE, "gone", None)) is FeedEnded
    classify(grpc.StatusCode.OK, "", None)  # OK: nothing raised
