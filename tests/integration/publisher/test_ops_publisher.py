"""Operations of the publisher daemon, as a real process on loopback: systemd notify,
TLS and mutual TLS, tokens and grants, health checks, config refusals.  No Spark."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import ClientTls, hash_token
from tests.support.certs import Certs, make_certs
from tests.support.harness import ROOT, Pair, wait_until
from tests.support.notify import NotifySocket, health

ADMIN = "admin-token-0123456789"
SUB1 = "sub1-token-0123456789"
SUB2 = "sub2-token-0123456789"


def _source(pair: Pair) -> sqlite3.Connection:
    conn = sqlite3.connect(str(pair.source_path), isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS u(id INTEGER PRIMARY KEY, v TEXT)")
    return conn


def test_sd_notify_ready_after_port_accepts_watchdog_stopping_exit_0(tmp_path: Path) -> None:
    """READY arrives only when the port already answers health checks; WATCHDOG pings;
    SIGTERM brings STOPPING=1 and a clean exit 0."""
    pair = Pair(tmp_path, tables=["t"])
    _source(pair)
    addr_file = tmp_path / "publisher" / "publisher.addr"

    def at_ready() -> str:
        return health(addr_file.read_text().strip())

    notify = NotifySocket(tmp_path / "notify.sock", on_ready=at_ready)
    pair.env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "300000"}
    try:
        pub = pair.start_publisher()
        wait_until(lambda: "READY=1" in notify.states(), 10, "READY")
        assert notify.ready_check == "SERVING"
        wait_until(lambda: notify.states().count("WATCHDOG=1") >= 3, 5, "three watchdog pings")
        assert pub.proc is not None
        pub.proc.send_signal(signal.SIGTERM)
        assert pub.proc.wait(30) == 0
        states = notify.states()
        assert states.index("READY=1") < states.index("STOPPING=1")
        assert "WATCHDOG=1" not in states[states.index("STOPPING=1") + 1 :]
    finally:
        pair.stop()
        notify.close()


def test_second_signal_forces_exit(tmp_path: Path) -> None:
    """A second SIGTERM during a drain ends the process at once with status 1."""
    script = (
        "import asyncio, sys\n"
        "from common.logging import configure_logging\n"
        "from common.serve import install_signal_handlers\n"
        "configure_logging(stream=sys.stderr)\n"
        "async def main():\n"
        "    stop = asyncio.Event()\n"
        "    install_signal_handlers(stop)\n"
        "    print('ready', flush=True)\n"
        "    await stop.wait()\n"
        "    print('draining', flush=True)\n"
        "    await asyncio.sleep(60)  # a drain that hangs\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().strip() == "draining"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _secure_publisher(tmp_path: Path, certs: Certs, *, mutual: bool) -> Pair:
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    if mutual:
        tls["client_ca_file"] = str(certs.ca)
    pair = Pair(tmp_path, tables=["t"], publisher_extra={"tls": tls})
    _source(pair)
    return pair


def test_tls_server_refuses_plaintext_and_unknown_ca(tmp_path: Path, certs: Certs) -> None:
    """With [tls] the port speaks only TLS: the right CA works, plaintext and another CA fail."""
    pair = _secure_publisher(tmp_path, certs, mutual=False)
    try:
        pub = pair.start_publisher()
        assert health(pub.address, ClientTls(ca_file=str(certs.ca))) == "SERVING"
        with pytest.raises(grpc.RpcError) as plain:
            health(pub.address)
        assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as other:
            health(pub.address, ClientTls(ca_file=str(certs.other_ca)))
        assert other.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        pair.stop()


def test_mutual_tls_requires_a_client_certificate(tmp_path: Path, certs: Certs) -> None:
    """With client_ca_file a client without a certificate from that CA cannot connect."""
    pair = _secure_publisher(tmp_path, certs, mutual=True)
    try:
        pub = pair.start_publisher()
        with pytest.raises(grpc.RpcError) as no_cert:
            health(pub.address, ClientTls(ca_file=str(certs.ca)))
        assert no_cert.value.code() == grpc.StatusCode.UNAVAILABLE
        full = ClientTls(str(certs.ca), str(certs.client_cert), str(certs.client_key))
        assert health(pub.address, full) == "SERVING"
        # The health check command used by containers speaks the same options.
        ok = subprocess.run(
            [
                sys.executable,
                "-m",
                "common.healthcheck",
                pub.address,
                "--ca",
                str(certs.ca),
                "--cert",
                str(certs.client_cert),
                "--key",
                str(certs.client_key),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == "SERVING"
        bad = subprocess.run(
            [sys.executable, "-m", "common.healthcheck", pub.address, "--ca", str(certs.ca)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert bad.returncode == 1
        assert "unhealthy" in bad.stderr
    finally:
        pair.stop()


def test_healthcheck_command_plaintext_and_down(tmp_path: Path) -> None:
    """common.healthcheck: 0 against a running daemon (address or addr file), 1 when down."""
    pair = Pair(tmp_path, tables=["t"])
    _source(pair)
    try:
        pub = pair.start_publisher()
        cmd = [sys.executable, "-m", "common.healthcheck"]
        by_file = subprocess.run(
            [*cmd, "--addr-file", str(pub.addr_file)], cwd=ROOT, capture_output=True, timeout=30
        )
        assert by_file.returncode == 0, by_file.stderr
        address = pub.address
    finally:
        pair.stop()
    down = subprocess.run(
        [*cmd, address, "--timeout", "1"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert down.returncode == 1
    assert "UNAVAILABLE" in down.stderr


# -- tokens and grants ---------------------------------------------------------------------


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Pair]:
    """A publisher with two publications, an admin token and two subscribers' grants."""
    pair = Pair(
        tmp_path,
        tables=["t"],
        publisher_extra={
            "auth": {"admin_token_hashes": [hash_token(ADMIN, "pbkdf2-sha256", iterations=1000)]},
            "subscriber": [
                {"name": "sub1", "token_hash": hash_token(SUB1), "publications": ["shop"]},
                {"name": "sub2", "token_hash": hash_token(SUB2), "publications": ["*"]},
            ],
        },
    )
    conn = _source(pair)
    cfg = pair.write_publisher_config()
    # A second publication the grants can be checked against.
    cfg.write_text(cfg.read_text() + '\n[[publication]]\nname = "other"\ntables = ["u"]\n')
    pair.write_publisher_config = lambda listen="127.0.0.1:0": cfg  # type: ignore[method-assign]
    pair.start_publisher()
    conn.execute("INSERT INTO t VALUES (1, 'a')")
    conn.execute("INSERT INTO u VALUES (1, 'b')")
    assert pair.pub is not None
    wait_until(lambda: _head(pair, "shop") == _head(pair, "other") == 2, 10, "capture")
    try:
        yield pair
    finally:
        pair.stop()


def _head(pair: Pair, publication: str) -> int:
    assert pair.pub is not None
    with grpc.insecure_channel(pair.pub.address) as ch:
        resp = rpc.AdminStub(ch).ListPublications(
            pb.ListPublicationsRequest(), timeout=5, metadata=(("x-txrepl-token", ADMIN),)
        )
    return next(int(p.head) for p in resp.publications if p.name == publication)


def _list_subscribers(pair: Pair, token: str) -> list[pb.SubscriberInfo]:
    assert pair.pub is not None
    md = (("x-txrepl-token", token),) if token else None
    with grpc.insecure_channel(pair.pub.address) as ch:
        resp = rpc.AdminStub(ch).ListSubscribers(
            pb.ListSubscribersRequest(), timeout=5, metadata=md
        )
    return list(resp.subscribers)


def _sync(pair: Pair, token: str, subscriber: str, publication: str) -> pb.PublisherMessage:
    """Send a Hello; return the first message (raises grpc.RpcError when refused)."""
    assert pair.pub is not None
    hello = pb.SubscriberMessage()
    hello.hello.subscriber = subscriber
    hello.hello.publisher = "pub1"
    hello.hello.publication = publication
    md = (("x-txrepl-token", token),) if token else None
    done = threading.Event()

    def requests() -> Iterator[pb.SubscriberMessage]:
        yield hello
        done.wait(10)

    with grpc.insecure_channel(pair.pub.address) as ch:
        call = rpc.ReplicationStub(ch).Sync(requests(), metadata=md, timeout=10)
        try:
            return next(iter(call))
        finally:
            done.set()
            call.cancel()


def _code(fn: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code()


def test_sync_refusals_change_nothing(guarded: Pair) -> None:
    """No token or a wrong one: UNAUTHENTICATED; another subscriber's token or an ungranted
    publication: PERMISSION_DENIED; the registry stays empty throughout."""
    p = guarded
    unauth = grpc.StatusCode.UNAUTHENTICATED
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: _sync(p, "", "sub1", "shop")) == unauth
    assert _code(lambda: _sync(p, "wrong-token", "sub1", "shop")) == unauth
    assert _code(lambda: _sync(p, SUB1, "sub2", "shop")) == denied
    assert _code(lambda: _sync(p, SUB1, "sub1", "other")) == denied
    assert _code(lambda: _sync(p, ADMIN, "sub1", "shop")) == denied
    assert _list_subscribers(p, ADMIN) == []
    first = _sync(p, SUB1, "sub1", "shop")
    assert first.HasField("welcome")
    assert first.welcome.head == _head(p, "shop") == 2
    assert _sync(p, SUB2, "sub2", "other").HasField("welcome")
    names = sorted((s.publication, s.subscriber) for s in _list_subscribers(p, ADMIN))
    assert names == [("other", "sub2"), ("shop", "sub1")]
    assert "sub1-token" not in (p.workdir / "publisher.log").read_text()


def test_admin_and_publish_need_their_credentials(guarded: Pair) -> None:
    """Admin calls need the admin token; Publish needs an admin or publish token."""
    p = guarded
    assert _code(lambda: _list_subscribers(p, "")) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: _list_subscribers(p, "nope")) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: _list_subscribers(p, SUB1)) == grpc.StatusCode.PERMISSION_DENIED
    assert _list_subscribers(p, ADMIN) == []
    assert p.pub is not None
    op = pb.Op()
    op.sql.sql = "SELECT 1"
    req = pb.PublishRequest(publication="shop", ops=[op])
    with grpc.insecure_channel(p.pub.address) as ch:
        stub = rpc.ReplicationStub(ch)
        assert _code(lambda: stub.Publish(req, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        assert (
            _code(lambda: stub.Publish(req, timeout=5, metadata=(("x-txrepl-token", SUB1),)))
            == grpc.StatusCode.PERMISSION_DENIED
        )
        assert _head(p, "shop") == 2
        resp = stub.Publish(req, timeout=5, metadata=(("x-txrepl-token", ADMIN),))
    assert resp.seq == 3
    # Health stays open for probes.
    assert health(p.pub.address) == "SERVING"


def test_plaintext_off_loopback_refused_unless_allowed(tmp_path: Path, certs: Certs) -> None:
    """Without TLS a non-loopback listen address is a config error naming the key;
    allow_insecure_non_loopback or [tls] lifts it.  Checked with `txrepl config check`."""
    base = 'server_name = "p"\nsource = "sqlite:///s.db"\n'

    def check(text: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "p.toml"
        path.write_text(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXREPL_")}
        return subprocess.run(
            [sys.executable, "-m", "common.cli", "config", "check", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )

    refused = check(base + 'listen = "0.0.0.0:7400"\n')
    assert refused.returncode == 2
    assert "listen '0.0.0.0:7400' is not a loopback address" in refused.stderr
    assert (
        check(base + 'listen = "0.0.0.0:7400"\nallow_insecure_non_loopback = true\n').returncode
        == 0
    )
    tls = f'[tls]\ncert_file = "{certs.server_cert}"\nkey_file = "{certs.server_key}"\n'
    ok = check(base + 'listen = "0.0.0.0:7400"\n' + tls)
    assert ok.returncode == 0, ok.stderr
    assert "ok (publisher p)" in ok.stdout


def test_admin_cli_speaks_tls_and_tokens(tmp_path: Path, certs: Certs) -> None:
    """`txrepl admin publications` reaches a TLS publisher with --ca; refused without it."""
    pair = _secure_publisher(tmp_path, certs, mutual=False)
    try:
        pub = pair.start_publisher()
        base = [sys.executable, "-m", "common.cli", "admin", "--publisher", pub.address]
        ok = subprocess.run(
            [*base, "publications", "--ca", str(certs.ca), "--server-name", "localhost"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ok.returncode == 0, ok.stderr
        assert "shop" in ok.stdout
        plain = subprocess.run([*base, "publications"], capture_output=True, text=True, timeout=60)
        assert plain.returncode == 5  # TLS mismatch (common/exits.py)
        assert "speaks TLS, this client plaintext" in plain.stderr
    finally:
        pair.stop()


def test_admin_cli_sends_the_admin_token(guarded: Pair, tmp_path: Path) -> None:
    """With an admin token configured, the CLI needs --token-file; without it: UNAUTHENTICATED."""
    assert guarded.pub is not None
    token_file = tmp_path / "admin.token"
    token_file.write_text(ADMIN)
    base = [sys.executable, "-m", "common.cli", "admin", "--publisher", guarded.pub.address]
    env = {k: v for k, v in os.environ.items() if k != "TXREPL_TOKEN"}
    ok = subprocess.run(
        [*base, "subscribers", "--token-file", str(token_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(
        [*base, "subscribers"], capture_output=True, text=True, timeout=60, env=env
    )
    assert refused.returncode == 1
    assert "UNAUTHENTICATED" in refused.stderr


# -- every RPC, enumerated from the proto ----------------------------------------------------

PUBLISHER_SERVICES = ("Replication", "Admin")


def _request(method: Any, subscriber: str, publication: str) -> Any:
    """The request of ``method`` naming ``subscriber`` and ``publication`` where it can."""
    if method.input_type.name == "SubscriberMessage":
        msg = pb.SubscriberMessage()
        msg.hello.subscriber = subscriber
        msg.hello.publisher = "pub1"
        msg.hello.publication = publication
        return msg
    msg = getattr(pb, method.input_type.name)()
    fields = method.input_type.fields_by_name
    if "subscriber" in fields:
        msg.subscriber = subscriber
    if "publication" in fields:
        msg.publication = publication
    if "ops" in fields:
        msg.ops.add().sql.sql = "SELECT 1"
    return msg


def _call_every_rpc(address: str, token: str, subscriber: str, publication: str) -> dict[str, Any]:
    """Call every method of the publisher's services; method name → status code (or the
    first answer when the call was served)."""
    md = (("x-txrepl-token", token),) if token else None
    out: dict[str, Any] = {}
    with grpc.insecure_channel(address) as ch:
        for service in PUBLISHER_SERVICES:
            desc = pb.DESCRIPTOR.services_by_name[service]
            for m in desc.methods:
                path = f"/{desc.full_name}/{m.name}"
                req = _request(m, subscriber, publication)
                reply = getattr(pb, m.output_type.name).FromString
                kw: dict[str, Any] = {
                    "request_serializer": type(req).SerializeToString,
                    "response_deserializer": reply,
                }
                try:
                    if m.client_streaming:
                        call = ch.stream_stream(path, **kw)(iter([req]), metadata=md, timeout=10)
                        out[m.name] = next(iter(call))
                        call.cancel()
                    elif m.server_streaming:
                        stream = ch.unary_stream(path, **kw)(req, metadata=md, timeout=10)
                        out[m.name] = next(iter(stream))
                        stream.cancel()
                    else:
                        out[m.name] = ch.unary_unary(path, **kw)(req, metadata=md, timeout=10)
                except grpc.RpcError as e:
                    out[m.name] = e.code()
    return out


def test_every_rpc_refuses_missing_wrong_and_ungranted_tokens_and_reads_nothing(
    guarded: Pair,
) -> None:
    """Each RPC of Replication and Admin (Snapshot included), enumerated from the proto:
    no token or an unknown one → UNAUTHENTICATED; another subscriber's token, or a
    publication the token is not granted → PERMISSION_DENIED.  Nothing is read (no
    snapshot starts) and nothing changes (heads, registry)."""
    p = guarded
    assert p.pub is not None
    methods = {
        m.name for s in PUBLISHER_SERVICES for m in pb.DESCRIPTOR.services_by_name[s].methods
    }
    assert "Snapshot" in methods
    unauth = grpc.StatusCode.UNAUTHENTICATED
    denied = grpc.StatusCode.PERMISSION_DENIED
    cases = [
        ("", "sub1", "shop", unauth),
        ("wrong-token", "sub1", "shop", unauth),
        (SUB1, "sub2", "shop", denied),  # sub1's token, acting as sub2
        (SUB1, "sub1", "other", denied),  # sub1 is granted shop only
    ]
    for token, subscriber, publication, want in cases:
        got = _call_every_rpc(p.pub.address, token, subscriber, publication)
        assert got == dict.fromkeys(methods, want), (token, subscriber, publication)
    assert _head(p, "shop") == _head(p, "other") == 2
    assert _list_subscribers(p, ADMIN) == []
    assert "snapshot requested" not in (p.workdir / "publisher.log").read_text()


def _snapshot_start(pair: Pair, token: str, subscriber: str, publication: str) -> Any:
    assert pair.pub is not None
    with grpc.insecure_channel(pair.pub.address) as ch:
        req = pb.SnapshotRequest(subscriber=subscriber, publication=publication)
        stream = rpc.ReplicationStub(ch).Snapshot(
            req, metadata=(("x-txrepl-token", token),), timeout=10
        )
        first = next(iter(stream))
        stream.cancel()
        return first


def test_snapshot_is_served_to_its_granted_subscriber_and_to_an_admin(guarded: Pair) -> None:
    """The refusals above are not a closed door: sub1 reads its own publication, sub2
    (granted every publication) reads "other", an admin token reads either."""
    assert _snapshot_start(guarded, SUB1, "sub1", "shop").start.publication == "shop"
    assert _snapshot_start(guarded, SUB2, "sub2", "other").start.seq == 2
    assert _snapshot_start(guarded, ADMIN, "", "other").start.publication == "other"
    assert _code(lambda: _snapshot_start(guarded, SUB2, "sub1", "shop")) == (
        grpc.StatusCode.PERMISSION_DENIED
    )


def test_admin_options_after_the_action_as_the_issue_writes_them(
    guarded: Pair, tmp_path: Path
) -> None:
    """`txrepl admin subscribers --publisher H:P` works as `txrepl admin --publisher H:P
    subscribers` does (it used to end in "unrecognized arguments"), run as the
    installed `txrepl` command; the address given after the action is the one used."""
    assert guarded.pub is not None
    token_file = tmp_path / "admin.token"
    token_file.write_text(ADMIN)
    txrepl = str(Path(sys.executable).parent / "txrepl")
    env = {k: v for k, v in os.environ.items() if k != "TXREPL_TOKEN"}
    address = guarded.pub.address
    for argv in (
        [txrepl, "admin", "subscribers", "--publisher", address, "--token-file", str(token_file)],
        [txrepl, "admin", "--publisher", address, "subscribers", "--token-file", str(token_file)],
        [txrepl, "admin", "publications", "--publisher", address, "--token-file", str(token_file)],
    ):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, (argv, out.stderr)
        assert out.stdout.split()[0] in ("PUBLICATION", "publisher")
