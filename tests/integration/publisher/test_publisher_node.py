"""The publisher's node (issue 24): a configured name that disagrees with the recorded one."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from common.origin import claim_node
from tests.support.harness import ROOT, to_toml


def test_node_mismatch_refused_in_one_line(tmp_path: Path) -> None:
    """A source recorded as node 'paris' and a config saying node = 'lyon': the
    publisher does not start, says so in one line naming both, and installs nothing."""
    db = tmp_path / "source.db"
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY)")
        claim_node(conn, "sqlite", "paris", "x")
    cfg = tmp_path / "publisher.toml"
    cfg.write_text(to_toml({
        "server_name": "pub1", "node": "lyon", "listen": "127.0.0.1:0",
        "data_dir": str(tmp_path / "data"), "source": f"sqlite:///{db}",
        "metrics_listen": "",
        "publication": [{"name": "shop", "tables": ["items"]}],
    }))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "publisher", "run", "--config", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "'paris'" in lines[0]
    assert "'lyon'" in lines[0]
    with sqlite3.connect(db) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "_txrepl_capture" not in names
