"""Shared test configuration: fixtures live in tests/fixtures/ and load as plugins."""

from __future__ import annotations

import pytest

from tests.fixtures import jvm

pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.spark_cluster",
    "tests.fixtures.postgres",
    "tests.fixtures.mariadb",
    "tests.support.backends",
]


@pytest.hookimpl(trylast=True)  # after `-m` deselection: a deselected twin does not count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop short variants whose slow twin runs too; speed up the Spark drivers' start.

    A fault test's short variant (``@pytest.mark.short_of("twin")``, the twin's name
    with its parameters, e.g. ``"test_x[60]"``) injects fewer faults
    through the same code as its slow twin, so when the twin is selected (``make test``,
    CI) the short one adds time and no coverage; ``make test-fast`` keeps it.
    """
    selected = {(item.path, item.name) for item in items}
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        twin = item.get_closest_marker("short_of")
        if twin is not None and (item.path, twin.args[0]) in selected:
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if any(item.get_closest_marker("spark") for item in items):
        jvm.configure()
