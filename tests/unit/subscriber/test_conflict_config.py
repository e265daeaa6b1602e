"""The conflict keys of a subscription: accepted forms, and one clear line for each
operator mistake (naming the subscription and the key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import ConfigError
from subscriber.config import load_config

BASE = """
server_name = "sub1"
target = "sqlite:///t.db"
{top}
[[subscription]]
publisher = "pub1"
address = "127.0.0.1:7400"
publication = "shop"
{keys}
"""


def _load(tmp_path: Path, keys: str, top: str = "") -> object:
    path = tmp_path / "s.toml"
    path.write_text(BASE.format(keys=keys, top=top))
    return load_config(path)


def test_updatable_subscription_forms(tmp_path: Path) -> None:
    """A built-in resolver, per-table overrides (off included), a Python and a SQL one."""
    cfg = _load(
        tmp_path,
        'conflicts = "subscriber_wins"\nconflict_time_column = "at"\n'
        "[subscription.conflict_tables]\n"
        'orders = "latest_commit_wins"\nlog = "off"\n'
        '"s.x" = "python:tests.support.conflict_resolvers:merge_names"\n'
        "y = \"sql:CASE WHEN loc.n > pub.n THEN 'ignore' ELSE 'take_publisher' END\"",
    )
    sc = cfg.subscription[0]  # type: ignore[attr-defined]
    assert sc.conflicts == "subscriber_wins"
    assert sc.conflict_tables["log"] == "off"


@pytest.mark.parametrize(
    ("keys", "top", "says"),
    [
        ('conflicts = "newest_wins"', "", "conflicts: unknown resolver 'newest_wins'"),
        ('conflicts = "latest_commit_wins"', "", "needs conflict_time_column"),
        ('conflicts = "python:nosuch.mod:f"', "", "cannot load 'nosuch.mod:f'"),
        ('conflicts = "python:nomodule"', "", "write python:package.module:function"),
        ('[subscription.conflict_tables]\nt = "subscriber_wins"', "", "needs conflicts"),
        ("conflict_pair = true", "", "conflict_pair needs conflicts"),
        (
            'conflicts = "publisher_wins"',
            "[apply]\njdbc_min_rows = 10",
            "set apply.jdbc_min_rows = 0",
        ),
        (
            'conflicts = "publisher_wins"',
            '[apply.tables.t]\nfilter = "n > 1"',
            "tables with transforms or history (t)",
        ),
    ],
)
def test_conflict_mistakes_refused_in_one_line(
    tmp_path: Path, keys: str, top: str, says: str
) -> None:
    """Each mistake is one ConfigError line saying what is wrong."""
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, keys, top)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_conflicts_on_a_mariadb_target_are_refused(tmp_path: Path) -> None:
    """Detection runs on SQLite and PostgreSQL targets; MariaDB is refused at start."""
    path = tmp_path / "s.toml"
    text = BASE.format(keys='conflicts = "publisher_wins"', top="")
    path.write_text(text.replace('"sqlite:///t.db"', '"mariadb://u@127.0.0.1:3306/db"'))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "not mariadb; remove conflicts from the subscription" in str(err.value)
