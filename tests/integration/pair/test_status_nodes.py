"""`txrepl status` and `txrepl subscriber status` name the nodes (docs/topologies.md).

Real daemons on SQLite nodes: node A's publisher is configured with a node name of
its own ("paris"), and node B runs a publisher (which records B as a node in its
database) and a subscriber applying A's publication into that database.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.support.harness import txrepl_cli, wait_until
from tests.support.nodes import Node, caught_up

pytestmark = [pytest.mark.spark]


def test_status_shows_the_publisher_node_and_the_target_node(tmp_path: Path) -> None:
    """The publisher's node shows beside its name, and the subscription's target node
    (whose own changes it does not apply back) beside the subscriber's, as text and
    as JSON."""
    nodes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        db = tmp_path / name / "node.db"
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, v TEXT)")
        nodes.append(Node(name, tmp_path / name, f"sqlite:///{db}", ["items"]))
    a, b = nodes
    a.publisher_extra = {"node": "paris"}
    try:
        a.start_publisher()
        b.start_publisher()  # records node "b" in b's database
        b.start_subscriber([a])
        assert a.pub is not None
        assert b.sub is not None
        wait_until(lambda: caught_up(nodes), 90, "the subscription to be in sync", interval=0.1)

        cmd = ("status", "--publisher", a.pub.address, "--subscriber", b.sub.address)
        table = txrepl_cli(*cmd, "--sample", "0")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert "publisher a  (node paris)" in lines, table.stdout
        assert "subscriber b-sub  (node b)" in lines, table.stdout

        doc = json.loads(txrepl_cli(*cmd, "--sample", "0", "--json").stdout)
        assert doc["publisher"] == "a"
        assert doc["node"] == "paris"
        (sub,) = doc["subscriber"]["subscriptions"]
        assert (sub["name"], sub["target_node"]) == ("a.shop", "b")

        control = txrepl_cli("subscriber", "status", "--control", b.sub.address)
        assert control.returncode == 0, control.stderr
        assert "    target node: b" in control.stdout.splitlines(), control.stdout
    finally:
        for n in nodes:
            n.stop()
