"""A subscriber loads only its target's driver (subscriber/targets/__init__.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_PROBE = """
import sys
import subscriber.daemon
from subscriber.targets import open_writer
w = open_writer("sqlite:///{db}")
print(sorted(m for m in ("psycopg", "pymysql") if m in sys.modules))
from subscriber.targets import target_package
from common.dburl import DatabaseUrl
target_package(DatabaseUrl.parse("postgresql://u@localhost/x", field="target"))
print(sorted(m for m in ("psycopg", "pymysql") if m in sys.modules))
"""


def test_a_subscriber_into_sqlite_does_not_load_the_other_drivers(tmp_path: Path) -> None:
    """psycopg and PyMySQL cost ~0.1 s of every start-up (a restart after an outage
    waits for it): they load when a URL of their dialect is first opened, not before."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(db=tmp_path / "t.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == ["[]", "['psycopg']"]
