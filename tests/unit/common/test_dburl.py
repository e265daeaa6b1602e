"""common.dburl and common.backoff: the values every config and retry loop builds on."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.backoff import Backoff
from common.dburl import DatabaseUrl


def test_sqlite_url_relative_to_base_dir():
    """A relative SQLite path is taken relative to the config's directory."""
    u = DatabaseUrl.parse("sqlite:///var/t.db", base_dir="/etc/txrepl")
    assert (u.dialect, u.sqlite_path) == ("sqlite", Path("/etc/txrepl/var/t.db"))
    assert DatabaseUrl.parse("sqlite:////abs/t.db").sqlite_path == Path("/abs/t.db")


@pytest.mark.parametrize("raw", ["postgresql://u@h:5432/db", "postgres://u@h/db"])
def test_postgres_url(raw):
    """Both PostgreSQL spellings are one dialect, and keep the URL as written."""
    u = DatabaseUrl.parse(raw)
    assert (u.dialect, str(u), u.path) == ("postgresql", raw, None)


@pytest.mark.parametrize("raw", ["mysql://u@h:3306/db", "mariadb://h/db"])
def test_mariadb_url(raw):
    """MariaDB and MySQL URLs are one dialect, a target's (issue 26)."""
    u = DatabaseUrl.parse(raw)
    assert (u.dialect, str(u), u.path) == ("mariadb", raw, None)


def test_mariadb_url_without_a_database_is_refused():
    with pytest.raises(ValueError, match=r"^target 'mariadb://u@h:3306': name the database"):
        DatabaseUrl.parse("mariadb://u@h:3306", field="target")


@pytest.mark.parametrize("raw", ["oracle://h/db", "sqlite://t.db", "/tmp/t.db", "postgresql://"])
def test_bad_url_names_the_field(raw):
    """Anything else is refused with the key and the accepted forms."""
    with pytest.raises(ValueError, match=r"^target .*(sqlite:///PATH)"):
        DatabaseUrl.parse(raw, field="target")


def test_backoff_grows_caps_and_jitters():
    """Delays double up to the cap; jitter spreads them both ways."""
    b = Backoff(initial_s=0.5, max_s=3.0, multiplier=2.0, jitter=0.2)
    assert [b.delay(n, 0.5) for n in (1, 2, 3, 4, 9)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert b.delay(1, 0.0) == pytest.approx(0.4)
    assert b.delay(1, 0.999999) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="jitter"):
        Backoff(jitter=2)
