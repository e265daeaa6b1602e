"""A SQLite publisher starts without loading the PostgreSQL drivers (issue 23, start-up)."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.support.harness import ROOT


def _loaded_after_opening_a_sqlite_source(packages: tuple[str, ...]) -> list[str]:
    """The modules of ``packages`` loaded once the daemon (and its CLI) are imported and
    a SQLite source opened, in a fresh interpreter."""
    code = (
        "import sys, tempfile, pathlib\n"
        "import publisher.daemon, publisher.cli\n"
        "from common.dburl import DatabaseUrl\n"
        "from publisher.capture.dialects import open_source\n"
        "import sqlite3\n"
        "db = pathlib.Path(tempfile.mkdtemp()) / 's.db'\n"
        "sqlite3.connect(db).close()\n"
        "open_source(DatabaseUrl.parse(f'sqlite:///{db}')).release()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {packages!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return list(ast.literal_eval(out.stdout.strip()))


def test_the_publisher_daemon_loads_no_postgresql_driver_until_a_url_names_one() -> None:
    """Importing the daemon and opening a SQLite source leaves psycopg and psycopg2 unloaded."""
    assert _loaded_after_opening_a_sqlite_source(("psycopg", "psycopg2")) == []


def test_capture_starts_without_sqlalchemy_which_only_the_registry_needs() -> None:
    """Importing the daemon and opening a SQLite source leaves SQLAlchemy unloaded: the
    registry imports it once capture runs (publisher/daemon.py, "Capture first")."""
    assert _loaded_after_opening_a_sqlite_source(("sqlalchemy",)) == []
