"""The per-transaction stage trace (common/trace.py) on a real PostgreSQL pair."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from common.trace import PUBLISHER_STAGES, SUBSCRIBER_STAGES, load
from tests.support.harness import Pair, wait_until
from tests.support.workload import W1, pg_source, run_pg, w1_checksum

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def test_trace_has_every_stage_in_order(tmp_path: Path, pg_server) -> None:
    """With trace_every = 2, both daemons write at exit a trace in which every traced
    seq the subscriber applied has all eight stages, each no earlier than the one before."""
    src_dsn, dst_dsn = pg_server.create_database(), pg_server.create_database()
    src = pg_source(src_dsn)
    w1 = W1(accounts=100)
    run_pg(src, w1.transactions(1))
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders"],
        source_url=src_dsn,
        target_url=dst_dsn,
        publisher_extra={"slot": "txrepl_trace", "trace_every": 2},
        subscriber_extra={"trace_every": 2},
    )
    try:
        pair.start_publisher()
        run_pg(src, w1.transactions(50))  # a backlog
        pair.start_subscriber()
        run_pg(src, w1.transactions(150))  # and in-sync traffic

        def equal() -> bool:
            with psycopg.connect(dst_dsn) as dst, psycopg.connect(src_dsn) as s:
                return bool(w1_checksum(s) == w1_checksum(dst))

        wait_until(equal, 180, "the target to equal the source", interval=0.5)
        head = pair.head()
    finally:
        pair.stop()  # SIGTERM: each daemon writes its trace at exit
        src.close()
    pub, pub_events = load(tmp_path / "publisher" / "trace.jsonl")
    sub, sub_events = load(tmp_path / "subscriber" / "trace.jsonl")
    traced = list(range(2, head + 1, 2))
    assert head > 200
    assert set(pub) == set(traced)
    assert set(sub) == set(traced)
    order = PUBLISHER_STAGES + SUBSCRIBER_STAGES
    for seq in traced:
        stages = {**pub[seq], **sub[seq]}
        assert sorted(stages) == sorted(order), (seq, stages)
        times = [stages[s] for s in order]
        assert times == sorted(times), (seq, dict(zip(order, times, strict=True)))
    assert any(e["event"] == "applied" for e in sub_events)
    assert any(e["event"] == "sent" for e in pub_events)
