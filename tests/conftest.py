"""Shared test configuration: fixtures live in tests/fixtures/ and load as plugins."""

from __future__ import annotations

import pytest

from tests.fixtures import jvm

pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.spark_cluster",
    "tests.fixtures.postgres",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before any Spark test runs, give the run's Spark drivers a faster start-up."""
    if any(item.get_closest_marker("spark") for item in items):
        jvm.configure()
