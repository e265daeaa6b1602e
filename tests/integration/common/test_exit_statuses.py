"""Operator errors end in one line naming what to fix and an exit status of their class
(common/exits.py, docs/operations.md "Exit statuses"): the real ``txrepl`` command in a
subprocess, against real daemons where it needs one."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.certs import Certs, make_certs
from tests.support.harness import ROOT, Pair, to_toml

PORT_BUSY, UNREADABLE_FILE, TLS_MISMATCH = 4, 3, 5


def txrepl(*argv: str) -> tuple[int, str]:
    """Run ``txrepl ARGV``; (exit status, stderr), stderr asserted to be one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXREPL_")}
    out = subprocess.run(
        [sys.executable, "-m", "common.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    err = out.stderr.strip()
    assert err, f"no message (status {out.returncode}; stdout {out.stdout!r})"
    assert "\n" not in err, f"more than one line:\n{err}"
    assert "Traceback" not in err
    return out.returncode, err


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield s.getsockname()[1]


def _publisher_config(tmp_path: Path, listen: str, metrics_listen: str) -> Path:
    src = tmp_path / "source.db"
    with sqlite3.connect(src) as conn:
        conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    config = tmp_path / "publisher.toml"
    config.write_text(
        to_toml(
            {
                "server_name": "pub1",
                "listen": listen,
                "metrics_listen": metrics_listen,
                "data_dir": str(tmp_path / "data"),
                "source": f"sqlite:///{src}",
                "publication": [{"name": "shop", "tables": ["t"]}],
            }
        )
    )
    return config


def _untouched(tmp_path: Path) -> None:
    """Nothing was changed: no data directory, no capture installed on the source."""
    assert not (tmp_path / "data").exists()
    with sqlite3.connect(tmp_path / "source.db") as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert not any(n.startswith("_txrepl") for n in names), names


def test_publisher_on_a_busy_grpc_port(tmp_path: Path, busy_port: int) -> None:
    """A busy listen port: one line naming the key and the address, status 4, nothing
    installed on the source."""
    config = _publisher_config(tmp_path, f"127.0.0.1:{busy_port}", "127.0.0.1:0")
    status, line = txrepl("publisher", "run", "--config", str(config))
    assert status == PORT_BUSY
    assert line.startswith(f"txrepl: listen = '127.0.0.1:{busy_port}': cannot listen: address")
    assert "set another listen" in line
    _untouched(tmp_path)


def test_publisher_on_a_busy_metrics_port(tmp_path: Path, busy_port: int) -> None:
    """A busy metrics_listen port: the same, naming metrics_listen."""
    config = _publisher_config(tmp_path, "127.0.0.1:0", f"127.0.0.1:{busy_port}")
    status, line = txrepl("publisher", "run", "--config", str(config))
    assert status == PORT_BUSY
    assert f"metrics_listen = '127.0.0.1:{busy_port}': cannot listen" in line
    _untouched(tmp_path)


def test_subscriber_on_a_busy_control_port(tmp_path: Path, busy_port: int) -> None:
    """The subscriber's control port busy: one line naming control_listen, before Spark."""
    config = tmp_path / "subscriber.toml"
    config.write_text(
        to_toml(
            {
                "server_name": "sub1",
                "target": f"sqlite:///{tmp_path / 'target.db'}",
                "control_listen": f"127.0.0.1:{busy_port}",
                "data_dir": str(tmp_path / "data"),
                "subscription": [
                    {"publisher": "pub1", "address": "127.0.0.1:1", "publication": "shop"}
                ],
            }
        )
    )
    status, line = txrepl("subscriber", "run", "--config", str(config))
    assert status == PORT_BUSY
    assert f"control_listen = '127.0.0.1:{busy_port}': cannot listen" in line
    assert not (tmp_path / "target.db").exists()


def test_missing_files_named_by_options(tmp_path: Path) -> None:
    """--token-file, --ca, --cert/--key naming missing files: one line naming the option
    and the path, status 3, before any connection."""
    missing = str(tmp_path / "nope")
    for option, argv in [
        ("--token-file", ["status", "--token-file", missing]),
        ("--ca", ["status", "--ca", missing]),
        ("--ca", ["admin", "publications", "--ca", missing]),
        ("--key", ["admin", "publications", "--cert", missing, "--key", missing]),
        ("--token-file", ["subscriber", "status", "--token-file", missing]),
    ]:
        status, line = txrepl(*argv)
        assert status == UNREADABLE_FILE, (argv, line)
        assert option in line, (argv, line)
        assert repr(missing) in line, (argv, line)
        assert "give a readable file" in line, (argv, line)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[dict[str, str]]:
    """Addresses of a plaintext, a TLS and a mutual-TLS publisher."""
    pairs = []
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    kinds = {
        "plain": {},
        "tls": {"tls": tls},
        "mtls": {"tls": {**tls, "client_ca_file": str(certs.ca)}},
    }
    out = {}
    try:
        for kind, extra in kinds.items():
            pair = Pair(tmp_path_factory.mktemp(kind), tables=["t"], publisher_extra=extra)
            with sqlite3.connect(pair.source_path) as conn:
                conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
            pairs.append(pair)
            out[kind] = pair.start_publisher().address
        yield out
    finally:
        for pair in pairs:
            pair.stop()


def test_tls_mismatches(daemons: dict[str, str], certs: Certs) -> None:
    """Plaintext against TLS, TLS against plaintext, an untrusted server or a missing
    client certificate: one line saying which and what to give, status 5."""
    ca, cert, key = str(certs.ca), str(certs.client_cert), str(certs.client_key)
    for kind, args, says in [
        ("tls", [], "speaks TLS, this client plaintext: give --ca"),
        ("plain", ["--ca", ca], "speaks plaintext, this client TLS: drop --tls/--ca"),
        ("tls", ["--ca", str(certs.other_ca)], "certificate is not signed by the CA"),
        ("mtls", ["--ca", ca], "requires a client certificate"),
    ]:
        for command in (["status", "--sample", "0"], ["admin", "publications"]):
            status, line = txrepl(*command, "--publisher", daemons[kind], *args)
            assert status == TLS_MISMATCH, (kind, args, line)
            assert line.startswith("txrepl: TLS mismatch: "), line
            assert says in line, (kind, args, line)
    # The right credentials still work (the classification is not a false alarm).
    ok = subprocess.run(
        [sys.executable, "-m", "common.cli", "admin", "publications",
         "--publisher", daemons["mtls"], "--ca", ca, "--cert", cert, "--key", key],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
