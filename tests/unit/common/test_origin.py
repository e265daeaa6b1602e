"""Node names recorded in a database, and PostgreSQL replication origin names (issue 24)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from common.origin import (
    NodeMismatchError,
    claim_node,
    node_of_pg_origin,
    pg_origin_name,
    stored_node,
)


def test_claim_records_once_and_refuses_another_configured_name(tmp_path: Path) -> None:
    """The first claim records the name; later ones read it back; a configured name that
    disagrees is refused in one line naming both, and the row is left as it was."""
    conn = sqlite3.connect(tmp_path / "n.db", isolation_level=None)
    assert stored_node(conn, "sqlite") == ""
    assert claim_node(conn, "sqlite", "", "pub1") == "pub1"
    assert claim_node(conn, "sqlite", "", "renamed") == "pub1"  # the default does not move it
    assert claim_node(conn, "sqlite", "pub1", "x") == "pub1"
    with pytest.raises(NodeMismatchError) as err:
        claim_node(conn, "sqlite", "paris", "x")
    assert "'pub1'" in str(err.value)
    assert "'paris'" in str(err.value)
    assert "\n" not in str(err.value)
    assert stored_node(conn, "sqlite") == "pub1"


def test_pg_origin_names_round_trip() -> None:
    """txrepl's replication origin names give their node back; any other origin (one of
    PostgreSQL's own subscriptions) is no node of txrepl's."""
    assert node_of_pg_origin(pg_origin_name("paris", "lyon.shop")) == "paris"
    assert node_of_pg_origin("pg_16384") == ""
    assert node_of_pg_origin("txrepl/bad name/x") == ""
