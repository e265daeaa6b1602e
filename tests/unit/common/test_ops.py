"""Operations pieces that need no daemon: token hashes, listen rules, config errors,
secret masking, cut classes, and the deploy/ files (units, images, compose, dashboard)."""

from __future__ import annotations

import configparser
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import yaml

from common.config import ConfigError
from common.configcheck import detect_kind
from common.feedstatus import cut_label
from common.logging import configure_logging
from common.metrics import METRICS
from common.rpc import txrepl_pb2 as pb
from common.security import (
    Principal,
    TokenBook,
    check_hash,
    check_listen,
    hash_token,
    is_loopback,
    verify_token,
)
from publisher.config import load_config as load_publisher
from subscriber.config import load_config as load_subscriber
from tests.support.harness import ROOT

DEPLOY = ROOT / "deploy"


@pytest.mark.parametrize("scheme", ["sha256", "pbkdf2-sha256"])
def test_token_hash_verifies_only_its_token(scheme: str) -> None:
    """A stored hash accepts its token and nothing else, and never contains it."""
    stored = hash_token("s3cret-token", scheme, iterations=1000)
    check_hash(stored)
    assert "s3cret" not in stored
    assert verify_token("s3cret-token", stored)
    assert not verify_token("s3cret-tokeN", stored)
    assert not verify_token("", stored)


def test_malformed_hashes_are_refused() -> None:
    """Clear-text tokens or truncated hashes in a config are errors, not silent passes."""
    for bad in ("s3cret", "sha256:abc", "md5:" + "0" * 32, "pbkdf2-sha256:10:00:00"):
        with pytest.raises(ValueError, match="not a token hash"):
            check_hash(bad)


def test_token_book_identifies_principals() -> None:
    """Tokens map to their principal; unknown tokens to None; grants are per publication."""
    book = TokenBook(
        [
            (hash_token("a"), Principal("admin", "admin")),
            (
                hash_token("s", "pbkdf2-sha256", iterations=1000),
                Principal("s1", "subscriber", ("shop",)),
            ),
        ]
    )
    assert book.identify("a") == Principal("admin", "admin")
    s1 = book.identify("s")
    assert s1 is not None
    assert s1.may_use("shop")
    assert not s1.may_use("other")
    assert book.identify("s") is s1  # cached verdict
    assert book.identify("x") is None
    assert book.identify("") is None


def test_loopback_rule() -> None:
    """Plaintext listeners must be on loopback unless TLS is on or insecure is allowed."""
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("10.1.2.3")
    check_listen("127.0.0.1:1", field="listen", tls=False, allow_insecure=False)
    check_listen("0.0.0.0:1", field="listen", tls=True, allow_insecure=False)
    check_listen("0.0.0.0:1", field="listen", tls=False, allow_insecure=True)
    with pytest.raises(ValueError, match="not a loopback address"):
        check_listen("[::]:1", field="listen", tls=False, allow_insecure=False)


PUB = 'server_name = "p"\nsource = "sqlite:///s.db"\n[[publication]]\nname = "shop"\n'
SUB = (
    'server_name = "s"\ntarget = "sqlite:///t.db"\n[[subscription]]\npublisher = "p"\n'
    'address = "127.0.0.1:7400"\npublication = "shop"\n'
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (PUB + '[[subscriber]]\nname = "s1"\ntoken_hash = "plain"\n', "subscriber[0]"),
        (
            PUB + f'[[subscriber]]\nname = "s1"\ntoken_hash = "{hash_token("t")}"\n'
            'publications = ["nope"]\n',
            "unknown publication",
        ),
        (
            PUB + f'[[subscriber]]\nname = "s1"\ntoken_hash = "{hash_token("t")}"\n',
            "auth.admin_token_hashes",
        ),
        (PUB + '[tls]\ncert_file = "missing.crt"\nkey_file = "missing.key"\n', "tls.cert_file"),
        (PUB + '[tls]\ncert_file = "a.crt"\n', "cert_file and key_file go together"),
        ('listen = "10.0.0.1:7400"\n' + PUB, "not a loopback address"),
        ('metrics_listen = "nope"\n' + PUB, "metrics_listen"),
    ],
)
def test_publisher_config_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    """Bad security settings fail at load with the file and the key in the message."""
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_publisher(path)
    assert message in str(e.value)
    assert str(path) in str(e.value)


def test_subscriber_config_tls_and_token_file(tmp_path: Path) -> None:
    """Subscription TLS settings become ClientTls; a missing token_file is an error."""
    (tmp_path / "ca.crt").write_text("x")
    path = tmp_path / "s.toml"
    path.write_text(SUB + 'ca_file = "ca.crt"\n')
    cfg = load_subscriber(path)
    tls = cfg.subscription[0].client_tls
    assert tls is not None
    assert tls.ca_file == "ca.crt"
    path.write_text(SUB + 'token_file = "nope.token"\n')
    with pytest.raises(ConfigError, match=r"subscription\[0\]\.token_file"):
        load_subscriber(path)
    path.write_text(SUB.replace('"s"', '"s"\ncontrol_listen = "0.0.0.0:7401"', 1))
    with pytest.raises(ConfigError, match="control_listen"):
        load_subscriber(path)


def test_config_check_detects_the_daemon(tmp_path: Path) -> None:
    """`txrepl config check` tells publisher from subscriber configs by their keys."""
    assert detect_kind({"source": "x"}, "f") == "publisher"
    assert detect_kind({"target": "x", "subscription": []}, "f") == "subscriber"
    with pytest.raises(ConfigError, match="cannot tell"):
        detect_kind({"server_name": "x"}, "f")
    for name, text, kind in (("p.toml", PUB, "publisher"), ("s.toml", SUB, "subscriber")):
        (tmp_path / name).write_text(text)
        out = subprocess.run(
            [sys.executable, "-m", "common.cli", "config", "check", str(tmp_path / name)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert f"ok ({kind} " in out.stdout
    (tmp_path / "bad.toml").write_text(PUB + "bogus = 1\n")
    bad = subprocess.run(
        [sys.executable, "-m", "common.cli", "config", "check", str(tmp_path / "bad.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "bogus: unknown key" in bad.stderr


def test_token_hash_command_reads_stdin() -> None:
    """`txrepl token hash` prints the sha256 form of the token given on stdin."""
    out = subprocess.run(
        [sys.executable, "-m", "common.cli", "token", "hash"],
        input="abc\n",
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    assert out.stdout.strip() == hash_token("abc")


def test_secrets_are_masked_in_logs() -> None:
    """Keys naming tokens, passwords or secrets are masked, also inside nested tables."""
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)
    try:
        structlog.get_logger("t").info(
            "x", token="tok-1", config={"auth": {"admin_password": "pw-2"}, "ok": 1}, n=3
        )
    finally:
        structlog.reset_defaults()
    line = json.loads(buf.getvalue())
    assert line["token"] == "***"
    assert line["config"] == {"auth": {"admin_password": "***"}, "ok": 1}
    assert "tok-1" not in buf.getvalue()
    assert "pw-2" not in buf.getvalue()


def test_cut_reasons_become_few_labels() -> None:
    """Cut reasons carry numbers; the metric label is a fixed class, named by the cut's kind."""
    assert cut_label(pb.CUT_KIND_QUEUE_THRESHOLD) == "queue_threshold"
    assert cut_label(pb.CUT_KIND_SEND_TIMEOUT) == "send_timeout"
    assert cut_label(pb.CUT_KIND_PUBLISHER_SHUTTING_DOWN) == "publisher_shutting_down"
    assert cut_label(pb.CUT_KIND_PURGED) == "purged"
    assert cut_label(pb.CUT_KIND_UNSPECIFIED) == "other"


# -- deploy/ ---------------------------------------------------------------------------------


def _unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string((DEPLOY / "systemd" / name).read_text())
    return cp


@pytest.mark.parametrize("daemon", ["publisher", "subscriber"])
def test_systemd_units(daemon: str) -> None:
    """Type=notify with a watchdog, a dedicated user, a state directory, hardening, restart;
    ExecStart runs the real command of this package."""
    svc = _unit(f"txrepl-{daemon}.service")["Service"]
    assert svc["Type"] == "notify"
    assert int(svc["WatchdogSec"]) > 0
    assert svc["User"] == "txrepl"
    assert svc["StateDirectory"] == f"txrepl-{daemon}"
    assert svc["ProtectSystem"] == "strict"
    assert svc["Restart"] == "on-failure"
    assert svc["NoNewPrivileges"] == "yes"
    assert f"{daemon} run --config /etc/txrepl/{daemon}.toml" in svc["ExecStart"]
    assert "config check" in svc["ExecStartPre"]


def test_compose_file() -> None:
    """compose.yaml parses; both daemons, PostgreSQL source and target, health checks,
    volumes; every file it mounts or builds from exists."""
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = doc["services"]
    assert set(services) == {"source-db", "target-db", "publisher", "subscriber"}
    assert "wal_level=logical" in services["source-db"]["command"]
    for name, svc in services.items():
        assert "healthcheck" in svc, name
        assert svc.get("volumes"), name
        for vol in svc["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), vol
            else:
                assert src in doc["volumes"], vol
        if "build" in svc:
            context = (DEPLOY / svc["build"]["context"]).resolve()
            assert context == ROOT
            assert (context / svc["build"]["dockerfile"]).is_file()
    assert services["subscriber"]["depends_on"]["publisher"]["condition"] == "service_healthy"


@pytest.mark.parametrize("daemon", ["publisher", "subscriber"])
def test_dockerfiles_reference_what_exists(daemon: str) -> None:
    """COPY sources exist, the entrypoint is txrepl under tini, the health check and the
    baked-in config work with this checkout (the config passes `config check`)."""
    text = (DEPLOY / "docker" / f"Dockerfile.{daemon}").read_text()
    for src in re.findall(r"^COPY (\S+(?: \S+)*) \S+$", text, re.M):
        for path in src.split():
            assert (ROOT / path).exists(), path
    assert '"/usr/bin/tini", "--", "txrepl"' in text
    assert "common.healthcheck" in text
    assert f"{daemon}.addr" in text
    if daemon == "subscriber":
        assert "openjdk-17-jre-headless" in text
    __import__("common.healthcheck")
    cfg = DEPLOY / "docker" / f"{daemon}.toml"
    out = subprocess.run(
        [sys.executable, "-m", "common.cli", "config", "check", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_grafana_dashboard_uses_exported_metrics() -> None:
    """Every metric the dashboard queries is one the daemons export."""
    dash = json.loads((DEPLOY / "grafana" / "txrepl-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\btxrepl_[a-z_]+", e)}
    assert used
    for name in used:
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert base in METRICS, name
        kind = METRICS[base][0]
        if name.endswith("_total"):
            assert kind == "counter", name
        if name.endswith(("_bucket", "_sum", "_count")):
            assert kind == "histogram", name
