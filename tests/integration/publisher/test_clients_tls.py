"""The Publish client and the admin commands against a TLS + mutual-TLS publisher, with
tokens read from files, all through the one client builder (common.security)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from common.client import PublishClient, sql_op
from common.config import ConfigError
from common.errors import PermanentError, TransientError
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import ClientTls, aio_channel_factory, hash_token
from tests.support.certs import Certs, make_certs
from tests.support.harness import Pair

ADMIN = "admin-token-0123456789"
PUBLISH = "publish-token-0123456789"
SUB1 = "sub1-token-0123456789"
TXREPL = str(Path(sys.executable).parent / "txrepl")


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[tuple[Pair, Certs]]:
    """A publisher with [tls] requiring client certificates, an admin token and a
    publish token granted "shop"; both tokens in files next to the certificates."""
    certs = make_certs(tmp_path / "certs")
    pair = Pair(
        tmp_path,
        tables=["t"],
        publisher_extra={
            "tls": {
                "cert_file": str(certs.server_cert),
                "key_file": str(certs.server_key),
                "client_ca_file": str(certs.ca),
            },
            "auth": {"admin_token_hashes": [hash_token(ADMIN)]},
            "subscriber": [
                {"name": "sub1", "token_hash": hash_token(SUB1), "publications": ["shop"]}
            ],
        },
    )
    conn = sqlite3.connect(str(pair.source_path), isolation_level=None)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.close()
    cfg = pair.write_publisher_config()
    cfg.write_text(
        cfg.read_text()
        + f'\n[auth.publish.app]\ntoken_hash = "{hash_token(PUBLISH)}"\npublications = ["shop"]\n'
    )
    pair.write_publisher_config = lambda listen="127.0.0.1:0": cfg  # type: ignore[method-assign]
    (tmp_path / "admin.token").write_text(ADMIN + "\n")
    (tmp_path / "publish.token").write_text(PUBLISH + "\n")
    pair.start_publisher()
    try:
        yield pair, certs
    finally:
        pair.stop()


def _mtls(certs: Certs) -> ClientTls:
    return ClientTls(str(certs.ca), str(certs.client_cert), str(certs.client_key))


def test_publish_client_over_mutual_tls_with_a_token_file(secure: tuple[Pair, Certs]) -> None:
    """PublishClient(tls=..., token_file=...) appends over mutual TLS; without a client
    certificate the handshake fails (TransientError: UNAVAILABLE); without the token the
    call is UNAUTHENTICATED; an unreadable token file is a ConfigError naming it."""
    pair, certs = secure
    assert pair.pub is not None
    token_file = pair.workdir / "publish.token"
    with PublishClient(pair.pub.address, tls=_mtls(certs), token_file=token_file) as client:
        first = client.publish("shop", [sql_op("SELECT 1")])
        assert client.publish("shop", [sql_op("SELECT 2")]) == first + 1
    no_cert = ClientTls(ca_file=str(certs.ca))
    with (
        PublishClient(pair.pub.address, tls=no_cert, token_file=token_file, timeout_s=5) as c,
        pytest.raises(TransientError, match="UNAVAILABLE"),
    ):
        c.publish("shop", [sql_op("SELECT 1")])
    with (
        PublishClient(pair.pub.address, tls=_mtls(certs)) as c,
        pytest.raises(PermanentError, match="UNAUTHENTICATED"),
    ):
        c.publish("shop", [sql_op("SELECT 1")])
    with pytest.raises(ConfigError, match=r"token_file '.*missing.token': cannot read the token"):
        PublishClient(pair.pub.address, token_file=pair.workdir / "missing.token")


async def _welcome(address: str, tls: ClientTls, token: str) -> pb.PublisherMessage:
    """Open Sync through the daemon's channel builder, send a Hello; the first answer.

    A refused call may end before the Hello goes out: the write then fails on our
    side and the read raises the call's status.  But when the write's failure
    reaches grpc before the server's status does, grpc records INTERNAL ("Internal
    error from Core") as the call's status and the server's is lost; that race is
    the client library's, so the call is made again (the subscriber's stream does the
    same: INTERNAL is transient for it, subscriber/stream.py).
    """
    for _ in range(5):
        channel = aio_channel_factory(tls, token=token)(address)
        async with channel:
            call = rpc.ReplicationStub(channel).Sync()
            hello = pb.SubscriberMessage()
            hello.hello.subscriber = "sub1"
            hello.hello.publisher = "pub1"
            hello.hello.publication = "shop"
            written = True
            try:
                await call.write(hello)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                written = False
            try:
                first = await asyncio.wait_for(call.read(), 10)
                assert isinstance(first, pb.PublisherMessage)
                return first
            except grpc.aio.AioRpcError as e:
                if written or e.code() != grpc.StatusCode.INTERNAL:
                    raise
            finally:
                call.cancel()
    raise AssertionError("five calls in a row lost the server's status to the write race")


async def test_sync_channel_over_mutual_tls_carries_the_token(
    secure: tuple[Pair, Certs],
) -> None:
    """The subscriber daemon's Sync channel (aio_channel_factory, the asyncio twin of
    client_channel) reaches the mutual-TLS publisher with the token on the call: welcomed;
    without the token: UNAUTHENTICATED."""
    pair, certs = secure
    assert pair.pub is not None
    first = await _welcome(pair.pub.address, _mtls(certs), SUB1)
    assert first.HasField("welcome")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _welcome(pair.pub.address, _mtls(certs), "")
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_hello_after_the_refusal_reports_the_refusal(
    secure: tuple[Pair, Certs],
) -> None:
    """The subscriber's stream (subscriber/stream.py) without its token: the publisher
    refuses the call before reading the Hello.  When that refusal has already ended the
    call as the Hello is written, the subscriber reports the refusal (UNAUTHENTICATED,
    a permanent error naming the token), not a local "RPC already finished"."""
    from subscriber.config import SubscriptionConfig
    from subscriber.errors import PermanentFeedError
    from subscriber.state import SubscriptionState
    from subscriber.stream import FeedStream

    pair, certs = secure
    assert pair.pub is not None
    channel = aio_channel_factory(_mtls(certs), token="")(pair.pub.address)
    async with channel:
        config = SubscriptionConfig(publisher="pub1", address=pair.pub.address, publication="shop")
        stream = FeedStream(channel, config, asyncio.Event())
        # The call starts when it is made: wait until the publisher has ended it.
        assert await asyncio.wait_for(stream.call.code(), 10) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(PermanentFeedError, match=r"UNAUTHENTICATED: .*needs a token"):
            await stream.hello("sub1", SubscriptionState("pub1.shop", 0, ""))


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TXREPL_TOKEN"}
    return subprocess.run([TXREPL, *argv], capture_output=True, text=True, timeout=60, env=env)


def test_admin_commands_over_mutual_tls_with_token_files(secure: tuple[Pair, Certs]) -> None:
    """`txrepl admin publications|subscribers|drop-subscriber|invalidate|mark-valid` and
    `txrepl status` reach the mutual-TLS publisher with --ca/--cert/--key and
    --token-file (drop/invalidate/mark-valid of a subscriber that never synced answer
    NOT_FOUND from the servicer: the call got through); without the client certificate
    they cannot connect, without the token they are UNAUTHENTICATED."""
    pair, certs = secure
    assert pair.pub is not None
    address = pair.pub.address
    tls = ["--ca", str(certs.ca), "--cert", str(certs.client_cert), "--key", str(certs.client_key)]
    token = ["--token-file", str(pair.workdir / "admin.token")]

    pubs = _run("admin", "publications", "--publisher", address, "--json", *tls, *token)
    assert pubs.returncode == 0, pubs.stderr
    assert [p["name"] for p in json.loads(pubs.stdout)["publications"]] == ["shop"]
    subs = _run("admin", "subscribers", "--publisher", address, "--json", *tls, *token)
    assert subs.returncode == 0, subs.stderr
    assert json.loads(subs.stdout) == {"subscribers": []}
    status = _run("status", "--publisher", address, "--json", *tls, *token)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["publisher"] == "pub1"
    for action in ("drop-subscriber", "invalidate", "mark-valid"):
        out = _run("admin", action, "shop", "nobody", "--publisher", address, *tls, *token)
        assert out.returncode == 1
        assert out.stderr.startswith("txrepl: NOT_FOUND: subscriber 'nobody' has never synced")

    no_cert = _run("admin", "publications", "--publisher", address, "--ca", str(certs.ca), *token)
    assert no_cert.returncode == 5  # a TLS mismatch (docs/operations.md, exit statuses)
    assert "client certificate" in no_cert.stderr
    assert "--cert and --key" in no_cert.stderr
    no_token = _run("admin", "publications", "--publisher", address, *tls)
    assert no_token.returncode == 1
    assert no_token.stderr.startswith("txrepl: UNAUTHENTICATED: ")
