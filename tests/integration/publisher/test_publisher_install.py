"""``pip install .`` without extras gives a working publisher and no Spark, exactly as
deploy/docker/Dockerfile.publisher builds its image.

The test reads the Dockerfile: the files its ``COPY`` lines put into the build
directory are copied into a temporary one, and its ``pip install`` line is run there in
a fresh venv (pip's own cache and the configured indexes, as ``make setup`` uses: no
other network).  From that venv: pyspark, pyarrow, pandas and numpy are not
installed, ``txrepl publisher run`` serves a real SQLite source, the image's health
check answers, and ``txrepl subscriber run`` says in one line to install
``txrepl[subscriber]``.  About 20-40 s (a wheel build and an install); marked slow.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.harness import ROOT, Daemon, Pair, wait_until
from tests.support.noextra import extra_modules

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile.publisher"


def _image_install(src: Path) -> list[str]:
    """Copy what the Dockerfile copies into its build dir; return its pip arguments."""
    text = DOCKERFILE.read_text()
    workdir = re.search(r"^WORKDIR (\S+)$", text, re.M)
    assert workdir is not None
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, dest = line.split()
        if not (dest.startswith("./") or dest == "."):
            continue  # into the image's /etc, not the build dir
        for s in sources:
            target = src / dest / Path(s).name if dest.endswith("/") or dest == "./" else src / dest
            if (ROOT / s).is_dir():
                shutil.copytree(
                    ROOT / s, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / s, target)
    install = re.search(r"/bin/pip install (.+)$", text, re.M)
    assert install is not None, "Dockerfile.publisher installs txrepl with pip"
    return [a for a in shlex.split(install.group(1)) if a != "--no-cache-dir"]


@pytest.mark.slow
def test_pip_install_without_extras_runs_a_publisher_without_spark(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pip_args = _image_install(src)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_ = venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [str(bin_ / "pip"), "install", "-q", *pip_args],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    for module in sorted(extra_modules()):
        probe = subprocess.run(
            [str(bin_ / "python"), "-c", f"import {module}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode != 0, f"{module} is installed without the subscriber extra"

    pair = Pair(tmp_path, tables=["t"])
    conn = sqlite3.connect(str(pair.source_path), isolation_level=None)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO t VALUES (1, 'a')")
    pub = Daemon(
        "publisher",
        pair.write_publisher_config(),
        tmp_path / "publisher" / "publisher.addr",
        tmp_path / "publisher.log",
        env=env,
        command=[str(bin_ / "txrepl"), "publisher"],
        cwd=tmp_path,  # not the checkout: nothing of the worktree on sys.path
    ).start()
    try:

        def run(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                list(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
            )

        health = run(str(bin_ / "python"), "-m", "common.healthcheck", "--addr-file",
                     str(pub.addr_file))  # fmt: skip
        assert health.returncode == 0, health.stdout + health.stderr
        conn.execute("INSERT INTO t VALUES (2, 'b')")

        def head() -> str:
            out = run(str(bin_ / "txrepl"), "admin", "--publisher", pub.address, "publications")
            assert out.returncode == 0, out.stderr
            return out.stdout

        wait_until(lambda: re.search(r"^shop\s+2\b", head(), re.M) is not None, 30,
                   "head 2 in `txrepl admin publications`")  # fmt: skip
        refused = run(str(bin_ / "txrepl"), "subscriber", "run", "--config",
                      str(pair.write_subscriber_config(pub.address)))  # fmt: skip
        assert refused.returncode == 2
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "pip install 'txrepl[subscriber]'" in refused.stderr
        imported = run(str(bin_ / "python"), "-c", "import publisher; print(publisher.__file__)")
        assert str(venv) in imported.stdout, "the publisher came from the venv"
    finally:
        assert pub.stop() == 0, pub.tail()
