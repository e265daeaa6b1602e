"""Retention purges what valid subscribers no longer need, and limits invalidate loudly."""

from __future__ import annotations

from pathlib import Path

from publisher.config import PublicationConfig
from publisher.log import open_log
from publisher.publication import Publication
from publisher.registry import Registry
from publisher.retention import apply_retention


def _setup(tmp_path: Path, **cfg: object) -> tuple[Publication, Registry]:
    plog = open_log(tmp_path / "log", segment_bytes=4096)
    for _ in range(40):  # ~40 KiB in 4 KiB segments: a segment rolls between appends
        plog.append([b"x" * 100] * 10)
    pub = Publication(PublicationConfig(name="p", **cfg), plog)  # type: ignore[arg-type]
    return pub, Registry(f"sqlite:///{tmp_path / 'registry.db'}")


def test_no_subscribers_keeps_everything(tmp_path: Path) -> None:
    pub, reg = _setup(tmp_path)
    assert apply_retention(pub, reg) == 0
    assert pub.log.first_seq == 1


def test_purges_below_the_lowest_valid_level_only(tmp_path: Path) -> None:
    pub, reg = _setup(tmp_path)
    reg.ensure("p", "fast", pub.log.incarnation, 390)
    reg.ensure("p", "slow", pub.log.incarnation, 150)
    reg.ensure("p", "gone", pub.log.incarnation, 3)
    reg.mark_invalid("p", "gone", "test")
    purged = apply_retention(pub, reg)
    assert purged > 0
    # Whole segments only, and never past what 'slow' still needs.
    assert 1 < pub.log.first_seq <= 151
    assert pub.log.read(151, max_entries=1) == [b"x" * 100]
    assert reg.get("p", "slow").valid  # type: ignore[union-attr]


def test_size_limit_invalidates_subscribers_that_needed_purged_entries(tmp_path: Path) -> None:
    pub, reg = _setup(tmp_path, retain_max_bytes=12_000)
    reg.ensure("p", "behind", pub.log.incarnation, 10)
    reg.ensure("p", "current", pub.log.incarnation, 400)
    apply_retention(pub, reg)
    first = pub.log.first_seq
    assert first > 11
    assert pub.log.size_bytes <= 12_000 + 4096
    behind = reg.get("p", "behind")
    assert behind is not None
    assert not behind.valid
    assert "were purged by the retention limits" in behind.invalid_reason
    assert reg.get("p", "current").valid  # type: ignore[union-attr]


def test_a_subscriber_admitted_during_a_pass_is_not_purged_past(tmp_path: Path) -> None:
    """A new subscriber's first Hello arrives while a retention pass runs on a
    publication nobody had synced: the pass must not purge what it needs (it did: the
    pass read "no valid level" before the registration and "some subscriber" after it,
    took every subscriber for invalid and purged up to the head's segment; the
    subscriber, admitted at level 0, then found entry 1 gone)."""
    import threading

    from common.rpc import txrepl_pb2 as pb
    from publisher._admission import admit

    pub, reg = _setup(tmp_path)
    hello = pb.Hello(subscriber="new", publisher="pub1", publication="p", level=0)
    refusals: list[object] = []
    admission = threading.Thread(target=lambda: refusals.append(admit(reg, pub, hello)))
    read_levels = reg.min_valid_level

    def levels_then_a_hello(publication: str) -> int | None:
        low = read_levels(publication)
        admission.start()  # the Hello comes between the pass's two registry reads
        admission.join(1.0)  # under the fix it waits for the pass to end
        return low

    reg.min_valid_level = levels_then_a_hello  # type: ignore[method-assign]
    apply_retention(pub, reg)
    admission.join(10)
    assert refusals == [None]  # admitted
    row = reg.get("p", "new")
    assert row is not None
    assert row.valid
    assert pub.log.first_seq == 1, "a pass purged entries the admitted subscriber needs"
