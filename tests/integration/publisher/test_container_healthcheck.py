"""The images' HEALTHCHECK command, exactly as deploy/docker writes it, against a real
mutual-TLS publisher: healthy with the TXREPL_HEALTHCHECK_* settings a container is
given, unhealthy (one line saying what to give) without them."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.support.certs import make_certs
from tests.support.harness import ROOT, Pair

DATA_DIR = "/var/lib/txrepl"


def healthcheck_command(dockerfile: Path) -> list[str]:
    """The exec-form CMD of the file's HEALTHCHECK instruction."""
    text = dockerfile.read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("HEALTHCHECK ")]
    m = re.search(r"CMD\s+(\[.*\])\s*$", line)
    assert m, line
    cmd: list[str] = json.loads(m.group(1))
    return cmd


def test_image_healthcheck_speaks_mutual_tls_from_the_environment(tmp_path: Path) -> None:
    """Both images run the same check; against [tls] with client_ca_file it passes with
    TXREPL_HEALTHCHECK_CA/_CERT/_KEY/_SERVER_NAME and fails without them."""
    docker = ROOT / "deploy" / "docker"
    pub_cmd = healthcheck_command(docker / "Dockerfile.publisher")
    sub_cmd = healthcheck_command(docker / "Dockerfile.subscriber")
    assert [a.replace("subscriber.addr", "publisher.addr") for a in sub_cmd] == pub_cmd
    assert pub_cmd[0] == "python"

    certs = make_certs(tmp_path / "certs")
    tls = {
        "cert_file": str(certs.server_cert),
        "key_file": str(certs.server_key),
        "client_ca_file": str(certs.ca),
    }
    pair = Pair(tmp_path, tables=["t"], publisher_extra={"tls": tls})
    with sqlite3.connect(pair.source_path) as conn:
        conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    try:
        pub = pair.start_publisher()
        cmd = [
            sys.executable,
            *(a.replace(DATA_DIR, str(pub.addr_file.parent)) for a in pub_cmd[1:]),
        ]
        base = {k: v for k, v in os.environ.items() if not k.startswith("TXREPL_")}

        def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                cmd, cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60
            )

        bare = run({})
        assert bare.returncode == 1
        assert bare.stderr.startswith("unhealthy: TLS mismatch: "), bare.stderr
        assert "speaks TLS, this client plaintext" in bare.stderr

        no_cert = run({"TXREPL_HEALTHCHECK_CA": str(certs.ca)})
        assert no_cert.returncode == 1
        assert "requires a client certificate" in no_cert.stderr, no_cert.stderr

        ok = run(
            {
                "TXREPL_HEALTHCHECK_CA": str(certs.ca),
                "TXREPL_HEALTHCHECK_CERT": str(certs.client_cert),
                "TXREPL_HEALTHCHECK_KEY": str(certs.client_key),
                "TXREPL_HEALTHCHECK_SERVER_NAME": "localhost",
            }
        )
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == "SERVING"
    finally:
        pair.stop()
