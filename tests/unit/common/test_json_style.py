"""`--json` output has one style across the `txrepl` commands (common/jsonout.py,
docs/operations.md "JSON output"), and `txrepl --version` tells the installed version."""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from common.cli import build_parser
from common.jsonout import message_dict
from common.rpc import txrepl_pb2 as pb

TXREPL = str(Path(sys.executable).parent / "txrepl")

# Every command with --json; each is run with it by a test (admin: the integration tests
# test_admin_subscribers_cli.py / test_clients_tls.py, subscriber control:
# test_subscriber_control.py, status: test_ops_pair.py / test_clients_tls.py; refresh-
# and drop-snapshot, subscriber conflicts: docs/operations.md, run by test_doc_commands.py).
JSON_COMMANDS = {
    "admin subscribers",
    "admin publications",
    "admin mark-valid",
    "admin drop-subscriber",
    "admin invalidate",
    "admin refresh-snapshot",
    "admin drop-snapshot",
    "status",
    "subscriber status",
    "subscriber pause",
    "subscriber resume",
    "subscriber reconnect",
    "subscriber unbreak",
    "subscriber errors list",
    "subscriber conflicts",
}


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, set[str]]:
    """Leaf command → its option strings."""
    out: dict[str, set[str]] = {}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        out[prefix.strip()] = {o for a in parser._actions for o in a.option_strings}
    for action in subs:
        for name, child in action.choices.items():
            out.update(_commands(child, f"{prefix} {name}"))
    return out


def test_the_commands_with_json_are_the_known_ones() -> None:
    """A new command with --json must be added here (and follow the style) on purpose."""
    with_json = {name for name, opts in _commands(build_parser()).items() if "--json" in opts}
    assert with_json == JSON_COMMANDS


def test_message_dict_snake_case_numbers_every_field() -> None:
    """Proto field names, 64-bit integers as JSON numbers (nested too), zero values
    present, enums by name, bytes as hex."""
    st = pb.SubscriptionStatus(name="pub1.shop", level=2**40, applied_rows=0)
    st.timeline.add(state="in_sync", at_us=-5)
    doc = message_dict(pb.StatusResponse(subscriber="sub1", subscriptions=[st]))
    (row,) = doc["subscriptions"]
    assert row["level"] == 2**40
    assert row["applied_rows"] == 0
    assert row["last_error"] == ""
    assert row["timeline"] == [{"state": "in_sync", "at_us": -5, "reason": ""}]
    batch = pb.Batch(first_seq=3, entries=[b"\x01\xff"])
    assert message_dict(batch)["entries"] == ["01ff"]
    assert message_dict(batch)["first_seq"] == 3
    welcome = pb.Welcome(state=pb.FEED_STATE_SYNCING)
    assert message_dict(welcome)["state"] == "FEED_STATE_SYNCING"


def test_errors_list_json_is_an_object(tmp_path: Path) -> None:
    """`txrepl subscriber errors list --json` prints an object holding the list (it
    printed a bare array), on a real SQLite target."""
    cfg = tmp_path / "sub.toml"
    cfg.write_text(
        'server_name = "sub1"\ntarget = "sqlite:///target.db"\n\n[[subscription]]\n'
        'publisher = "pub1"\naddress = "127.0.0.1:7400"\npublication = "shop"\n'
    )
    out = subprocess.run(
        [TXREPL, "subscriber", "errors", "list", "--config", str(cfg), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"errors": []}


def test_version_from_package_metadata() -> None:
    """`txrepl --version` prints the installed distribution's version, exit 0."""
    out = subprocess.run([TXREPL, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout == f"txrepl {version('txrepl')}\n"


def test_conflicts_json_is_an_object_and_a_missing_target_one_line(tmp_path: Path) -> None:
    """`txrepl subscriber conflicts --json` prints an object holding the list; a target
    file that does not exist is one line on stderr, exit 1, and is not created."""
    cfg = tmp_path / "sub.toml"
    cfg.write_text(
        'server_name = "sub1"\ntarget = "sqlite:///target.db"\n\n[[subscription]]\n'
        'publisher = "pub1"\naddress = "127.0.0.1:7400"\npublication = "shop"\n'
    )
    argv = [TXREPL, "subscriber", "conflicts", "--config", str(cfg), "--json"]
    missing = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1
    assert "does not exist" in missing.stderr
    assert not (tmp_path / "target.db").exists()
    sqlite3.connect(tmp_path / "target.db").close()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"conflicts": []}
