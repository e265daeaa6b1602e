"""Every command of README.md and docs/operations.md runs, exactly as written, against
real daemons (tests/support/doccommands.py says how blocks are found and run).

New fenced ``sh`` blocks in either document are picked up with no change here; a
command in an indented block, or a row of the operations command table that no run
block exercises, fails the fast checks below.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doccommands import SKIP_MARKER, shell_blocks, stray_commands
from tests.support.harness import ROOT

DOCS = ["README.md", "docs/operations.md"]
MAX_SKIPPED = 4  # "the few that cannot run": systemd, docker, make setup/test


def _table_commands() -> list[str]:
    """Command words of each row of operations.md's "## Commands" table, alternatives
    (``status|pause``) expanded, placeholders and options dropped."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    out: list[str] = []
    for row in re.findall(r"^\| (.+?) \| .+\|$", section, re.M):
        for span in re.findall(r"`([^`]+)`", row.replace("\\|", "\x00")):
            words = span.replace("\x00", "|").split()
            if not words or words[0] not in ("txrepl", "python"):
                continue
            prefix: list[list[str]] = [[]]
            value = False  # the word after an option: its placeholder
            for w in words:
                placeholder = w.isupper() or w == "H:P"
                if w.startswith("-"):
                    value = w.startswith("--")
                    continue
                if value and placeholder:
                    value = False
                    continue
                if w.startswith("[") or placeholder:
                    break
                value = False
                prefix = [[*p, alt] for p in prefix for alt in w.split("|")]
            out.extend(" ".join(p) for p in prefix if len(p) > 1)
    return out


def _run_lines() -> list[list[str]]:
    lines = []
    for doc in DOCS:
        for block in shell_blocks(ROOT / doc):
            if block.skip_reason:
                continue
            for line in block.text.splitlines():
                try:
                    lines.append(shlex.split(line, comments=True))
                except ValueError:
                    lines.append(line.split())
    return lines


def _covers(words: list[str], tokens: list[str]) -> bool:
    it = iter(tokens)
    return all(any(t == w for t in it) for w in words)


def test_no_command_outside_a_fenced_block() -> None:
    stray = [s for doc in DOCS for s in stray_commands(ROOT / doc)]
    assert stray == [], "fence these as ```sh so the doc test runs them:\n" + "\n".join(stray)


def test_every_command_of_the_operations_table_has_a_run_example() -> None:
    commands = _table_commands()
    assert "txrepl admin mark-valid" in commands  # the parser reads the table
    lines = _run_lines()
    missing = [c for c in commands if not any(_covers(c.split(), t) for t in lines)]
    assert missing == [], f"no run example in {DOCS} for: {missing}"


def test_skipped_blocks_are_few_and_say_why() -> None:
    skipped = [b for doc in DOCS for b in shell_blocks(ROOT / doc) if b.skip_reason]
    assert len(skipped) <= MAX_SKIPPED, [f"{b.doc}:{b.line}" for b in skipped]
    for doc in DOCS:
        for block in shell_blocks(ROOT / doc):
            assert SKIP_MARKER.rstrip(":") not in block.text or block.skip_reason, (
                f"{block.doc}:{block.line}: the marker goes on the block's first line"
            )


def _isolated() -> list[str]:
    """``unshare -rn`` (a private network namespace: the documented fixed ports cannot
    meet another process's) when the kernel lets us; else nothing."""
    if shutil.which("unshare") and shutil.which("ip"):
        probe = subprocess.run(
            ["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
        )
        if probe.returncode == 0:
            return ["unshare", "-rn"]
    return []


@pytest.mark.spark
def test_doc_commands_run_as_written(tmp_path: Path) -> None:
    prefix = _isolated()
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "tests.support.doccommands", str(tmp_path), *DOCS],
        cwd=ROOT,
        env={**os.environ, "TXREPL_DOCTEST_NETNS": "1" if prefix else ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=480)  # under pytest's own timeout
    except subprocess.TimeoutExpired:
        proc.terminate()  # the runner stops the daemons it started, then exits
        stdout, stderr = proc.communicate(timeout=120)
        pytest.fail(f"the documented commands took over 480 s:\n{stderr[-5000:]}")
    assert proc.returncode == 0, stderr[-5000:]
    report = json.loads(stdout.strip().splitlines()[-1])
    failed = [r for r in report["results"] if r["status"] not in ("ok", "skipped")]
    assert failed == [], "\n\n".join(
        f"{r['doc']}:{r['line']}: {r['status']}\n{r['detail']}" for r in failed
    )
    ran = [r for r in report["results"] if r["status"] == "ok"]
    assert len(ran) >= 10, report["results"]
    # "Stop each daemon with Ctrl-C or SIGTERM: it drains ... and exits."
    assert len(report["daemons"]) == 2, report["daemons"]
    assert all(code == 0 for code in report["daemons"].values()), report["daemons"]
