"""Shared test configuration: fixtures live in tests/fixtures/ and load as plugins."""

pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.spark_cluster",
    "tests.fixtures.postgres",
]
