"""``[apply] synchronous_commit``: "off" by default, "on" kept, anything else refused by
name at load, and ``txrepl subscriber check`` says so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.config import ConfigError
from common.dburl import DatabaseUrl
from subscriber.config import load_config
from subscriber.targets.postgres import open_writer

CONFIG = """
server_name = "sub1"
target = "postgresql://postgres@127.0.0.1:1/none"
{apply}
[[subscription]]
publisher = "pub1"
address = "127.0.0.1:7400"
publication = "shop"
"""


def _write(tmp_path: Path, apply: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(CONFIG.format(apply=apply))
    return path


ON = '[apply]\nsynchronous_commit = "on"'
OFF = '[apply]\nsynchronous_commit = "off"'


@pytest.mark.parametrize(("apply", "value"), [("", "off"), (ON, "on"), (OFF, "off")])
def test_synchronous_commit_values(tmp_path: Path, apply: str, value: str) -> None:
    """The default is "off" (acks follow the target's flushed WAL); "on" and "off" load."""
    assert load_config(_write(tmp_path, apply)).apply.synchronous_commit == value


def test_synchronous_commit_refused_by_name(tmp_path: Path) -> None:
    """Any other value is refused at load, naming the field and the values allowed."""
    with pytest.raises(ConfigError, match=r"apply\.synchronous_commit: 'sometimes' .*'on', 'off'"):
        load_config(_write(tmp_path, '[apply]\nsynchronous_commit = "sometimes"'))


def test_check_command_names_the_field(tmp_path: Path) -> None:
    """``txrepl subscriber check`` fails with one line naming the field, no traceback."""
    path = _write(tmp_path, '[apply]\nsynchronous_commit = "local"')
    proc = subprocess.run(
        [sys.executable, "-m", "common.cli", "subscriber", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "apply.synchronous_commit: 'local' is not allowed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_writer_refuses_a_bad_value() -> None:
    """The writer, made without a config file, refuses a bad value before connecting."""
    with pytest.raises(ValueError, match="synchronous_commit: must be on or off"):
        open_writer(
            DatabaseUrl.parse("postgresql://x@127.0.0.1:1/db", field="target"),
            type("Apply", (), {"synchronous_commit": "maybe"})(),
        )
