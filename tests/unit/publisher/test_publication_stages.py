"""A publication's stage latency (issue 23): capture at the append, durable when visible."""

from __future__ import annotations

import time
from pathlib import Path

from common.latency import StageLatency
from common.rpc import txrepl_pb2 as pb
from publisher.config import PublicationConfig
from publisher.log import open_log
from publisher.publication import Publication


def _pub(tmp_path: Path) -> tuple[Publication, StageLatency]:
    plog = open_log(tmp_path / "p", fsync="always")
    pub = Publication(PublicationConfig(name="p"), plog)
    stages = StageLatency("txrepl_publication_stage_seconds", "publication")
    pub.measure(stages)
    return pub, stages


def test_an_entry_is_counted_durable_only_once_it_is_visible(tmp_path: Path) -> None:
    """Appended without waiting (PostgreSQL capture): durable is observed at the flush."""
    pub, stages = _pub(tmp_path)
    now_us = int(time.time() * 1e6)
    for _ in range(3):
        pub.append(pb.Entry(commit_time_us=now_us), wait=False)
    assert stages.count("p", "capture") == 3
    assert stages.count("p", "durable") == 0  # written, not yet fsynced: not visible
    pub.log.flush()
    assert stages.count("p", "durable") == 3
    pub.log.close()


def test_send_is_observed_for_entries_made_durable_while_running(tmp_path: Path) -> None:
    """A feed's send of a known seq counts; a seq from before the start does not."""
    pub, stages = _pub(tmp_path)
    seq = pub.append(pb.Entry(commit_time_us=int(time.time() * 1e6)))  # waits: durable
    assert stages.count("p", "durable") == 1
    pub.sent(seq)
    pub.sent(seq + 100)  # not appended (yet): unknown, not counted
    assert stages.count("p", "send") == 1
    pub.log.close()
