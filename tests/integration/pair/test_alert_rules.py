"""The alert rules shipped beside the Grafana dashboard (deploy/grafana/txrepl-alerts.yaml)
query only metrics real daemons export: a PostgreSQL-source publisher and a subscriber,
really started, scraped after one row went through."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from common.metrics import METRICS
from tests.support.harness import ROOT, Pair, wait_until
from tests.support.scrape import scrape

RULES = ROOT / "deploy" / "grafana" / "txrepl-alerts.yaml"
# Prometheus's own series, not a daemon's: none here yet (``up`` would be one).
PROMETHEUS_OWN: set[str] = set()


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
        assert r["alert"].startswith("Txrepl"), r
        assert r["labels"]["severity"] in ("warning", "critical"), r
        assert r["annotations"]["summary"], r
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), names
    return rules


def _referenced(rules: list[dict[str, Any]]) -> set[str]:
    """Metric names in the rules' expressions (label values like "txrepl.*" are not)."""
    names: set[str] = set()
    for r in rules:
        names |= set(re.findall(r"\b(?:txrepl|process|python)_[a-z0-9_]+\b", r["expr"]))
    return names - PROMETHEUS_OWN


@pytest.mark.postgres
def test_every_metric_in_the_alert_rules_is_exported(tmp_path: Path, pg_db: str) -> None:
    """Each metric an alert queries has a sample in a real publisher's or subscriber's
    /metrics (the PostgreSQL slot's lag included), and txrepl_* ones are declared."""
    rules = _rules()
    used = _referenced(rules)
    assert {"txrepl_pg_slot_lag_bytes", "txrepl_health_serving"} <= used
    for name in used:
        if name.startswith("txrepl_"):
            assert re.sub(r"_(total|bucket|sum|count)$", "", name) in METRICS, name

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t(id int PRIMARY KEY, v text)")
    pair = Pair(
        tmp_path,
        tables=["t"],
        source_url=pg_db,
        target_url=f"sqlite:///{tmp_path / 'target.db'}",
        publisher_extra={"slot": "txrepl_alerts"},
    )
    try:
        pair.start_publisher()
        pair.start_subscriber()
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (1, 'one')")

        def applied() -> bool:
            with sqlite3.connect(tmp_path / "target.db") as target:
                try:
                    return target.execute("SELECT v FROM t").fetchall() == [("one",)]
                except sqlite3.OperationalError:  # no table yet
                    return False

        wait_until(applied, 120, "the row applied to the target")
        assert pair.pub is not None
        assert pair.sub is not None
        exported: set[str] = set()

        def all_there() -> bool:
            for daemon in (pair.pub, pair.sub):
                assert daemon is not None
                exported.update(name for name, _ in scrape(daemon.metrics_address))
            return used <= exported

        try:
            wait_until(all_there, 10, "every metric of the rules")
        except TimeoutError:
            raise AssertionError(f"not exported: {sorted(used - exported)}") from None
    finally:
        pair.stop()
