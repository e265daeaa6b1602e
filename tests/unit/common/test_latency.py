"""The stage latency histogram (common/latency.py): every thread's observations counted,
exported as prometheus' own histogram writes them; the secret mask of log lines."""

from __future__ import annotations

import io
import json
import threading

import pytest
import structlog
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from common.latency import BUCKETS, StageLatency
from common.logging import configure_logging

NAME = "txrepl_publication_stage_seconds"


def _exposition(registry: CollectorRegistry) -> list[str]:
    """The text a scrape reads, without prometheus' ``_created`` series."""
    return [
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    ]


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    """Sample (name and labels) → value, from the text a scrape reads."""
    out = {}
    for line in _exposition(registry):
        if not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            out[sample] = float(value)
    return out


def test_observations_of_many_threads_are_all_exported_as_prometheus_writes_them() -> None:
    """Four threads observe at once, including negative (clock skew: 0), bound-exact and
    over-the-top values; the scrape and the counts hold every observation, bucket by
    bucket, and read as a prometheus Histogram fed the same values."""
    values = [-0.5, 0.0, *BUCKETS, 0.0003, 0.004, 7.0, 120.0]  # exact sums: few, fixed
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    stages = StageLatency(NAME, "publication", ours_registry)
    theirs = Histogram(
        NAME, "doc", ["publication", "stage"], buckets=BUCKETS, registry=theirs_registry
    )
    start = threading.Barrier(4)

    def observe(stage: str) -> None:
        start.wait()
        for _ in range(500):
            for v in values:
                stages.observe("p", stage, v)

    threads = [threading.Thread(target=observe, args=(s,)) for s in ("durable", "send") * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for stage in ("durable", "send"):
        for _ in range(1000):
            for v in values:
                theirs.labels("p", stage).observe(max(v, 0.0))
    ours, expected = _samples(ours_registry), _samples(theirs_registry)
    assert ours.keys() == expected.keys()
    for sample, value in expected.items():  # sums added in another order: the last bits
        assert ours[sample] == pytest.approx(value, rel=1e-12), sample
    assert stages.count("p", "durable") == stages.count("p", "send") == 1000 * len(values)
    each = 1000 * len(values)
    assert stages.counts == {("p", "durable"): each, ("p", "send"): each}


def test_a_histogram_made_unregistered_is_exported_once_registered() -> None:
    """Counts kept before :meth:`register` are in the first scrape after it."""
    stages = StageLatency(NAME, "publication")
    stages.observe("p", "capture", 0.002)
    registry = CollectorRegistry()
    stages.register(registry)
    text = "\n".join(_exposition(registry))
    assert 'txrepl_publication_stage_seconds_count{publication="p",stage="capture"} 1.0' in text
    assert 'le="0.0015",publication="p",stage="capture"} 0.0' in text
    assert 'le="0.002",publication="p",stage="capture"} 1.0' in text


def test_secret_keys_are_masked_in_every_line_whatever_lines_came_before() -> None:
    """The mask, decided once per set of keys, still masks each line's own secrets: the
    same keys with new values, a new set of keys, and secrets nested in tables."""
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)
    try:
        logger = structlog.get_logger("t")
        logger.info("x", token="tok-1", n=1)
        logger.info("x", token="tok-2", n=2)
        logger.info("x", token="", n=3)  # empty: nothing to hide, left as is
        logger.info("x", n=4, db_password="pw-3", opts={"api_secret": "s-4", "ok": [1]})
        logger.info("x", n=5, opts=[{"authorization": "Bearer b-5"}])
    finally:
        structlog.reset_defaults()
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [line["token"] for line in lines[:3]] == ["***", "***", ""]
    assert lines[3]["db_password"] == "***"
    assert lines[3]["opts"] == {"api_secret": "***", "ok": [1]}
    assert lines[4]["opts"] == [{"authorization": "***"}]
    for secret in ("tok-1", "tok-2", "pw-3", "s-4", "b-5"):
        assert secret not in buf.getvalue()
