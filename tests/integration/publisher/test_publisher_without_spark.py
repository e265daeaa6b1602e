"""The publisher and the CLI's publisher/admin commands run where the subscriber's Spark
stack cannot be imported (the ``subscriber`` extra missing, as in the publisher image),
and subscriber commands that need it refuse in one line naming the extra.

Every Python process here starts with a ``sitecustomize`` that makes the extra's modules
(pyspark, pyarrow, pandas, numpy: read from pyproject.toml) unimportable and logs every
attempt; the publisher runs for real against a SQLite source.  The install itself (a
fresh venv with ``pip install .``) is test_publisher_install.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from subscriber.extra import MODULES
from tests.support.harness import ROOT, Pair, wait_until
from tests.support.noextra import attempts, blocking_env, extra_modules


def _txrepl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "common.cli", *args],
        cwd=ROOT,
        env={**_base_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _base_env() -> dict[str, str]:
    return dict(os.environ)


def test_extra_modules_are_the_ones_the_cli_checks() -> None:
    """subscriber.extra.MODULES (what the one-line refusal checks) names exactly the
    top-level modules of the distributions in pyproject.toml's `subscriber` extra."""
    assert set(MODULES) == extra_modules()


def test_publisher_runs_and_admin_works_without_the_subscriber_extra(tmp_path: Path) -> None:
    env, log = blocking_env(tmp_path / "noextra")
    probe = _txrepl(env, "--help")
    assert probe.returncode == 0, probe.stderr
    blocked = subprocess.run(
        [sys.executable, "-c", "import pyspark"],
        env={**_base_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert blocked.returncode != 0
    assert "No module named 'pyspark'" in blocked.stderr
    assert "import pyspark" in attempts(log, None)  # the blocker works and tells
    for f in log.parent.glob(log.name + ".*"):
        f.unlink()

    pair = Pair(tmp_path, tables=["t"], env=env)
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    src.execute("INSERT INTO t VALUES (1, 'before start')")
    pub_cfg = pair.write_publisher_config()
    check = _txrepl(env, "publisher", "check", "--config", str(pub_cfg))
    assert check.returncode == 0, check.stderr
    pub = pair.start_publisher()
    try:

        def head() -> int:
            out = _txrepl(env, "admin", "--publisher", pub.address, "publications", "--json")
            assert out.returncode == 0, out.stderr
            doc = json.loads(out.stdout)
            rows = doc if isinstance(doc, list) else doc.get("publications", [])
            return max((int(p["head"]) for p in rows if p["name"] == "shop"), default=0)

        src.execute("INSERT INTO t VALUES (2, 'while running')")
        wait_until(lambda: head() >= 2, 30, "the insert captured into the log")
        src.execute("UPDATE t SET v = 'changed' WHERE id = 1")
        wait_until(lambda: head() >= 3, 30, "the update captured into the log")
        status = _txrepl(env, "status", "--publisher", pub.address)
        assert status.returncode == 0, status.stderr
        assert "shop" in status.stdout
        subs = _txrepl(env, "admin", "--publisher", pub.address, "subscribers")
        assert subs.returncode == 0, subs.stderr
        token = _txrepl(env, "token", "generate")
        assert token.returncode == 0, token.stderr

        # The publisher, the admin client, `status` and `config check` never tried to
        # import one of the extra's modules (not even an import they would survive).
        assert attempts(log) == ""
        # The subscriber's config is checked without Spark; running it needs the extra.
        sub_cfg = pair.write_subscriber_config(pub.address)
        ok = _txrepl(env, "config", "check", str(sub_cfg))
        assert ok.returncode == 0, ok.stderr
        assert attempts(log) == ""
        for argv in (
            ["subscriber", "run", "--config", str(sub_cfg)],
            ["subscriber", "reinit", "pub1.shop", "--config", str(sub_cfg)],
            ["subscriber", "errors", "list", "--config", str(sub_cfg)],
        ):
            refused = _txrepl(env, *argv)
            assert refused.returncode == 2, (argv, refused.stderr)
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1, (argv, refused.stderr)
            assert "pip install 'txrepl[subscriber]'" in lines[0]
            assert "pyspark" in lines[0]
        assert not (tmp_path / "subscriber").exists() or not any(
            (tmp_path / "subscriber").iterdir()
        ), "a refused subscriber command must change nothing"
    finally:
        assert pub.stop() == 0, pub.tail()
    assert pub.proc is not None
    assert attempts(log, pub.proc.pid) == "", "the publisher daemon tried the extra's modules"
