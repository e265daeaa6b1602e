"""A subscriber configured without TLS against a TLS publisher says so in its status,
instead of a bare "Socket closed" (common/exits.py, through the subscription's loop)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.support.certs import make_certs
from tests.support.harness import Pair, wait_until


def test_plaintext_subscription_against_a_tls_publisher_names_the_fix(tmp_path: Path) -> None:
    """The subscription stays disconnected, its last error naming the TLS mismatch and
    the key to set (ca_file)."""
    certs = make_certs(tmp_path / "certs")
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    pair = Pair(tmp_path, tables=["t"], publisher_extra={"tls": tls})
    with sqlite3.connect(pair.source_path) as conn:
        conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    try:
        pair.start_publisher()
        pair.start_subscriber()

        def told() -> bool:
            return "TLS mismatch" in pair.status().last_error

        wait_until(told, 60, "the TLS mismatch in the subscription's status")
        st = pair.status()
        assert st.state in ("disconnected", "connecting")
        assert "speaks TLS, this client plaintext" in st.last_error
        assert "ca_file" in st.last_error
    finally:
        pair.stop()
