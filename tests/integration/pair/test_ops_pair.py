"""Operations of a running pair (real processes, Spark): mutual TLS and tokens end to end,
metrics scraped and checked against the registry, `txrepl status`, and the subscriber's
sd_notify drain on SIGTERM with its level committed."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import ClientTls, client_channel, hash_token
from tests.support.certs import Certs, make_certs
from tests.support.harness import ROOT, Pair, wait_until
from tests.support.notify import NotifySocket

pytestmark = pytest.mark.spark

ADMIN = "ops-admin-token-0123456789"
SUB1 = "ops-sub1-token-0123456789"
MD = (("x-txrepl-token", ADMIN),)


@dataclass
class Running:
    pair: Pair
    certs: Certs
    src: sqlite3.Connection
    notify: NotifySocket
    tls: ClientTls
    token_file: Path
    next_id: int = 1

    def write(self, n: int) -> None:
        for _ in range(n):
            self.src.execute("INSERT INTO t VALUES (?, ?)", (self.next_id, f"v{self.next_id}"))
            self.next_id += 1

    def admin(self) -> tuple[list[pb.PublicationInfo], list[pb.SubscriberInfo]]:
        assert self.pair.pub is not None
        with client_channel(self.pair.pub.address, self.tls) as ch:
            stub = rpc.AdminStub(ch)
            pubs = stub.ListPublications(pb.ListPublicationsRequest(), timeout=5, metadata=MD)
            subs = stub.ListSubscribers(pb.ListSubscribersRequest(), timeout=5, metadata=MD)
        return list(pubs.publications), list(subs.subscribers)

    def head(self) -> int:
        return int(self.admin()[0][0].head)

    def control(self, method: str = "Status") -> pb.SubscriptionStatus:
        assert self.pair.sub is not None
        with client_channel(self.pair.sub.address, self.tls) as ch:
            stub = rpc.SubscriberControlStub(ch)
            if method == "Status":
                (st,) = stub.Status(pb.StatusRequest(), timeout=5, metadata=MD).subscriptions
            else:
                resp = getattr(stub, method)(pb.SubscriptionRequest(), timeout=5, metadata=MD)
                (st,) = resp.subscriptions
        return st

    def caught_up(self) -> bool:
        st = self.control()
        return st.state == "in_sync" and st.level == self.head()

    def client_args(self) -> list[str]:
        c = self.certs
        return [
            "--ca",
            str(c.ca),
            "--cert",
            str(c.client_cert),
            "--key",
            str(c.client_key),
            "--token-file",
            str(self.token_file),
        ]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Publisher with mutual TLS and tokens; subscriber (under a fake systemd) syncing
    through TLS with a client certificate and its token; its control port on TLS too,
    needing the admin token."""
    tmp = tmp_path_factory.mktemp("ops-pair")
    certs = make_certs(tmp / "certs")
    token_file = tmp / "sub1.token"
    token_file.write_text(SUB1 + "\n")
    admin_file = tmp / "admin.token"
    admin_file.write_text(ADMIN + "\n")
    pair = Pair(
        tmp,
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
        subscriber_extra={
            "auth": {"admin_token_hashes": [hash_token(ADMIN)]},
            "tls": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)},
            # Small batches: a catch-up of a few thousand entries takes many applies, so
            # the SIGTERM test can catch one in progress.
            "batch": {"max_entries": 20},
        },
        subscription_extra={
            "ca_file": str(certs.ca),
            "cert_file": str(certs.client_cert),
            "key_file": str(certs.client_key),
            "token_file": str(token_file),
        },
    )
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    addr_file = tmp / "subscriber" / "subscriber.addr"

    def at_ready() -> str:
        # The control port must already answer when READY arrives.
        from tests.support.notify import health

        return health(addr_file.read_text().strip(), ClientTls(ca_file=str(certs.ca)))

    notify = NotifySocket(tmp / "notify.sock", on_ready=at_ready)
    tls = ClientTls(str(certs.ca), str(certs.client_cert), str(certs.client_key))
    run = Running(pair, certs, src, notify, tls, admin_file)
    try:
        pair.start_publisher()
        run.write(200)
        pair.env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"}
        pair.start_subscriber()
        wait_until(run.caught_up, 120, "the subscriber to catch up over mutual TLS")
        yield run
    finally:
        pair.stop()
        notify.close()


def _scrape(address: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def test_ready_after_control_port_and_watchdog(running: Running) -> None:
    """The subscriber said READY once its control port answered, and pings the watchdog."""
    assert running.notify.ready_check == "SERVING"
    wait_until(lambda: "WATCHDOG=1" in running.notify.states(), 5, "a watchdog ping")


def test_control_needs_admin_token(running: Running) -> None:
    """The control service refuses calls without the admin token."""
    assert running.pair.sub is not None
    with (
        client_channel(running.pair.sub.address, running.tls) as ch,
        pytest.raises(grpc.RpcError) as e,
    ):
        rpc.SubscriberControlStub(ch).Status(pb.StatusRequest(), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_every_control_rpc_refuses_missing_and_wrong_tokens_and_changes_nothing(
    running: Running,
) -> None:
    """Each method of SubscriberControl, enumerated from the proto, over TLS: no token or
    a token that is not one of its admin tokens (the subscriber's own publisher token)
    → UNAUTHENTICATED; the subscription is not paused or reconnected."""
    assert running.pair.sub is not None
    desc = pb.DESCRIPTOR.services_by_name["SubscriberControl"]
    before = running.control()
    for token, want in (
        ("", grpc.StatusCode.UNAUTHENTICATED),
        (SUB1, grpc.StatusCode.UNAUTHENTICATED),
    ):
        md = (("x-txrepl-token", token),) if token else None
        with client_channel(running.pair.sub.address, running.tls) as ch:
            for m in desc.methods:
                request = getattr(pb, m.input_type.name)()
                call = ch.unary_unary(
                    f"/{desc.full_name}/{m.name}",
                    request_serializer=type(request).SerializeToString,
                    response_deserializer=getattr(pb, m.output_type.name).FromString,
                )
                with pytest.raises(grpc.RpcError) as e:
                    call(request, timeout=5, metadata=md)
                assert e.value.code() == want, m.name
    after = running.control()
    assert after.state == before.state == "in_sync"
    assert after.sessions == before.sessions


def test_metrics_lag_matches_registry_and_status(running: Running) -> None:
    """With the subscriber paused behind the head, the publisher's lag metrics equal the
    registry's (Admin) and the subscriber's level metric equals its control status; then
    `txrepl status` shows the same numbers, as a table, as JSON and with a progress bar."""
    r = running
    assert r.pair.pub is not None
    assert r.pair.sub is not None
    r.control("Pause")
    # A batch in flight at the pause still commits; wait until the feed has ended.
    wait_until(lambda: r.admin()[1][0].state == "disconnected", 30, "the feed to end")
    head_before = r.head()
    r.write(30)
    wait_until(lambda: r.head() > head_before, 10, "capture of the new rows")
    heads = [r.head()]

    def settled() -> bool:
        # Unchanged over 2 s (five readings): on a loaded machine the capture thread
        # can be starved for longer than one interval, and the rows arrive later.
        heads.append(r.head())
        return len(heads) >= 5 and len(set(heads[-5:])) == 1

    wait_until(settled, 30, "capture to settle", interval=0.5)
    head = heads[-1]
    _, (info,) = r.admin()
    level = int(info.level)
    sub_level = r.control().level
    assert sub_level >= level
    m = _scrape(r.pair.pub.metrics_address)
    key = frozenset({("publication", "shop"), ("subscriber", "sub1")})
    assert m[("txrepl_subscriber_lag_entries", key)] == info.lag_entries == head - level
    assert m[("txrepl_subscriber_level", key)] == info.level == level
    assert abs(m[("txrepl_subscriber_lag_seconds", key)] - info.lag_seconds) < 2.0
    assert info.lag_seconds > 0
    assert m[("txrepl_publication_head", frozenset({("publication", "shop")}))] == head
    assert m[("txrepl_subscriber_valid", key)] == 1
    s = _scrape(r.pair.sub.metrics_address)
    sub_key = frozenset({("subscription", "pub1.shop")})
    assert s[("txrepl_subscription_level", sub_key)] == sub_level
    assert s[("txrepl_subscription_state", sub_key | {("state", "paused")})] == 1
    assert s[("txrepl_apply_batch_entries_count", sub_key)] >= 1

    cmd = [
        sys.executable,
        "-m",
        "common.cli",
        "status",
        "--publisher",
        r.pair.pub.address,
        "--subscriber",
        r.pair.sub.address,
        *r.client_args(),
    ]
    out = subprocess.run(
        [*cmd, "--json", "--sample", "0.3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["publisher"] == "pub1"
    (pub,) = doc["publications"]
    assert pub["name"] == "shop"
    assert pub["head"] == head
    assert pub["log_bytes"] > 0
    (sub,) = doc["subscribers"]
    assert (sub["subscriber"], sub["level"], sub["lag_entries"]) == ("sub1", level, head - level)
    assert sub["eta_s"] is None  # paused: the lag does not shrink
    assert doc["subscriber"]["subscriptions"][0]["state"] == "paused"

    table = subprocess.run(
        [*cmd, "--sample", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    row = next(line for line in table.splitlines() if line.startswith("shop") and "sub1" in line)
    assert row.split()[2:4] == [str(level), str(head - level)]
    assert re.search(rf"^shop\s+{head}\s+1\.\.{head}\s", table, re.M), table
    assert re.search(r"^pub1\.shop\s+paused\s", table, re.M), table

    watch = subprocess.run(
        [*cmd, "--watch", "--count", "2", "--interval", "0.2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert watch.count(f"{level}/{head}") == 2
    assert "[" in watch
    assert "%" in watch

    r.control("Resume")
    wait_until(r.caught_up, 60, "catch-up after resume")
    done = json.loads(
        subprocess.run(
            [*cmd, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )
    assert done["subscribers"][0]["lag_entries"] == 0
    assert done["subscribers"][0]["eta_s"] == 0


def test_sigterm_drains_with_level_committed(running: Running) -> None:
    """SIGTERM during a catch-up: STOPPING=1, exit 0, and the level the daemon reports at
    exit is the one committed in the target; a restart then resumes to target = source."""
    r = running
    sub = r.pair.sub
    assert sub is not None
    assert sub.proc is not None
    assert r.pair.pub is not None
    r.control("Pause")
    r.write(3000)
    # One channel each, opened before the Resume: a poll then costs a millisecond, not
    # two TLS handshakes, so a catch-up that takes a fraction of a second is still seen
    # in progress on a loaded machine.
    with (
        client_channel(r.pair.pub.address, r.tls) as pub_ch,
        client_channel(sub.address, r.tls) as sub_ch,
    ):
        admin = rpc.AdminStub(pub_ch)
        control = rpc.SubscriberControlStub(sub_ch)

        def catching_up() -> bool:
            (st,) = control.Status(pb.StatusRequest(), timeout=5, metadata=MD).subscriptions
            pubs = admin.ListPublications(pb.ListPublicationsRequest(), timeout=5, metadata=MD)
            return st.applied_entries > 0 and st.level < pubs.publications[0].head

        control.Resume(pb.SubscriptionRequest(), timeout=5, metadata=MD)
        wait_until(catching_up, 60, "a catch-up in progress", interval=0.002)
        sub.proc.send_signal(signal.SIGTERM)
    assert sub.proc.wait(60) == 0
    assert "STOPPING=1" in r.notify.states()
    stopped = [
        json.loads(line)
        for line in sub.log_path.read_text().splitlines()
        if '"subscriber stopped"' in line
    ]
    reported = stopped[-1]["levels"]["pub1.shop"]
    tgt = sqlite3.connect(str(r.pair.target_path))
    (committed,) = tgt.execute(
        "SELECT level FROM txrepl_subscriptions WHERE subscription = 'pub1.shop'"
    ).fetchone()
    assert committed == reported > 0
    r.pair.env = {}
    r.pair.start_subscriber()
    wait_until(r.caught_up, 120, "catch-up after restart")
    rows = tgt.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    assert rows == r.src.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    tgt.close()
