"""Publish tokens are granted per publication (``[auth.publish.<name>]``): a real
publisher refuses a token on a publication it is not granted, and writes nothing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from common.client import PublishClient, sql_op
from common.errors import PermanentError
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import hash_token
from tests.support.harness import Pair, to_toml, wait_until

ADMIN = "admin-token-0123456789"
SHOP_APP = "shop-app-token-0123456789"
LEGACY = "legacy-publish-token-0123456789"


def _publisher(tmp_path: Path, auth: dict[str, object]) -> Pair:
    """A publisher with publications "shop" and "other" and ``auth``."""
    pair = Pair(tmp_path, tables=["t"])
    conn = sqlite3.connect(str(pair.source_path), isolation_level=None)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.execute("CREATE TABLE u(id INTEGER PRIMARY KEY, v TEXT)")
    conn.close()
    cfg = pair.write_publisher_config()
    text = cfg.read_text() + '\n[[publication]]\nname = "other"\ntables = ["u"]\n'
    cfg.write_text(text + _auth_toml(auth))
    pair.write_publisher_config = lambda listen="127.0.0.1:0": cfg  # type: ignore[method-assign]
    return pair


def _auth_toml(auth: dict[str, object]) -> str:
    """``auth`` as TOML: top-level keys under [auth], dicts under [auth.publish.<name>]."""
    lines = ["", "[auth]"]
    grants = auth.get("publish", {})
    assert isinstance(grants, dict)
    lines += to_toml({k: v for k, v in auth.items() if k != "publish"}).splitlines()
    for name, grant in grants.items():
        lines.append(f"\n[auth.publish.{name}]")
        lines += to_toml(grant).splitlines()
    return "\n".join(lines) + "\n"


def _heads(pair: Pair) -> dict[str, int]:
    assert pair.pub is not None
    with grpc.insecure_channel(pair.pub.address) as ch:
        resp = rpc.AdminStub(ch).ListPublications(
            pb.ListPublicationsRequest(), timeout=10, metadata=(("x-txrepl-token", ADMIN),)
        )
    return {p.name: int(p.head) for p in resp.publications}


@pytest.fixture
def granted(tmp_path: Path) -> Iterator[Pair]:
    pair = _publisher(
        tmp_path,
        {
            "admin_token_hashes": [hash_token(ADMIN)],
            "publish": {"shop-app": {"token_hash": hash_token(SHOP_APP), "publications": ["shop"]}},
            "publish_token_hashes": [hash_token(LEGACY)],
        },
    )
    pair.start_publisher()
    try:
        yield pair
    finally:
        pair.stop()


def test_publish_token_granted_shop_is_refused_on_other_and_writes_nothing(
    granted: Pair,
) -> None:
    """The token of [auth.publish.shop-app] (publications = ["shop"]) appends to shop;
    on "other" it is PERMISSION_DENIED, naming the grant, and other's head stays put.
    An unknown token is UNAUTHENTICATED.  The older publish_token_hashes still reaches
    every publication."""
    assert granted.pub is not None
    address = granted.pub.address
    wait_until(lambda: "other" in _heads(granted), 10, "the publisher")
    before = _heads(granted)
    with PublishClient(address, token=SHOP_APP) as client:
        seq = client.publish("shop", [sql_op("SELECT 1")])
        assert seq == before["shop"] + 1
        with pytest.raises(PermanentError) as refused:
            client.publish("other", [sql_op("SELECT 1")])
    assert "PERMISSION_DENIED" in str(refused.value)
    assert "'shop-app' is not granted publication 'other'" in str(refused.value)
    with PublishClient(address, token="not-a-token") as client, pytest.raises(PermanentError) as e:
        client.publish("shop", [sql_op("SELECT 1")])
    assert "UNAUTHENTICATED" in str(e.value)
    assert _heads(granted) == {"shop": before["shop"] + 1, "other": before["other"]}
    with PublishClient(address, token=LEGACY) as client:
        assert client.publish("other", [sql_op("SELECT 1")]) == before["other"] + 1


@pytest.mark.parametrize(
    ("grant", "message"),
    [
        (
            {"token_hash": hash_token("x-token-0123456789"), "publications": ["nope"]},
            "auth.publish.app.publications: unknown publication(s) ['nope'] "
            "(known: ['other', 'shop'])",
        ),
        (
            {"token_hash": hash_token("x-token-0123456789"), "publications": []},
            "auth.publish.app: publications is empty: list the publications this token may "
            'publish to (["*"] for every one)',
        ),
        (
            {"token_hash": "plain-text", "publications": ["shop"]},
            "auth.publish.app: not a token hash",
        ),
    ],
)
def test_publish_grant_mistakes_are_one_line_naming_the_key(
    tmp_path: Path, grant: dict[str, object], message: str
) -> None:
    """`txrepl config check` refuses a grant of an unknown publication, an empty grant
    and a token in clear, in one line naming the key; exit 2."""
    pair = _publisher(
        tmp_path, {"admin_token_hashes": [hash_token(ADMIN)], "publish": {"app": grant}}
    )
    cfg = pair.write_publisher_config()
    out = subprocess.run(
        [sys.executable, "-m", "common.cli", "config", "check", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert message in out.stderr
