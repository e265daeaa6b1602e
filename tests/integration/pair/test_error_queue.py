"""The deferred-error queue with real daemons: a poisoned entry parked and skipped,
later entries applied, the cause fixed, the entry re-executed from the CLI; and a
subscription broken once its retry budget is spent, then unbroken."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from common.rpc import txrepl_pb2 as pb
from tests.support.harness import Daemon, Pair, subscriber_control, txrepl_cli, wait_until

pytestmark = pytest.mark.spark


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(str(path)) as conn:
        return conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()


def test_poisoned_entry_re_executed_after_later_entries(tmp_path: Path) -> None:
    pair = Pair(tmp_path, tables=["t"], subscriber_extra={"apply": {"error_policy": "skip"}})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    try:
        pair.start_publisher()
        sub = pair.start_subscriber()
        src.execute("INSERT INTO t VALUES (1, 'a')")
        pair.wait_caught_up()
        # A rule only the target has: v must be unique there.
        with sqlite3.connect(str(pair.target_path)) as tgt:
            tgt.execute("CREATE UNIQUE INDEX one_v ON t(v)")
        before = pair.head()
        src.execute("INSERT INTO t VALUES (2, 'a')")  # poisoned on the target
        # Its own entry (the capture may group commits that come close together).
        wait_until(lambda: pair.head() > before, 30, "the poisoned entry to be captured")
        src.execute("INSERT INTO t VALUES (3, 'c')")
        src.execute("INSERT INTO t VALUES (4, 'd')")
        wait_until(lambda: (4, "d") in _rows(pair.target_path), 60, "entries after the poison")
        head = pair.wait_caught_up()
        assert _rows(pair.target_path) == [(1, "a"), (3, "c"), (4, "d")]
        config = str(tmp_path / "subscriber.toml")
        listed = txrepl_cli("subscriber", "errors", "list", "--config", config, "--json")
        assert listed.returncode == 0, listed.stderr
        [stored] = json.loads(listed.stdout)["errors"]
        assert stored["status"] == "skipped"
        seq = str(stored["seq"])
        control = subscriber_control(sub.address)
        listed_rpc = control.ListErrors(pb.SubscriptionRequest(subscription="pub1.shop"))
        assert [(e.seq, e.status) for e in listed_rpc.errors] == [(int(seq), "skipped")]
        # The same through the CLI and the running daemon's control service.
        ctl = ("--control", sub.address)
        by_daemon = txrepl_cli("subscriber", "errors", "list", *ctl, "--json")
        assert by_daemon.returncode == 0, by_daemon.stderr
        [listed_by_daemon] = json.loads(by_daemon.stdout)["errors"]
        assert (listed_by_daemon["seq"], listed_by_daemon["status"]) == (int(seq), "skipped")
        refused_cli = txrepl_cli("subscriber", "errors", "retry", "pub1.shop", seq, *ctl)
        assert refused_cli.returncode != 0
        assert "UNIQUE" in refused_cli.stderr
        assert len(refused_cli.stderr.strip().splitlines()) == 1, refused_cli.stderr
        retry = pb.ErrorRequest(subscription="pub1.shop", seq=int(seq))
        # Before the fix, the control service's retry fails in one line, changing nothing.
        with pytest.raises(grpc.RpcError) as refused:
            control.RetryError(retry)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "UNIQUE" in str(refused.value.details())
        assert _rows(pair.target_path) == [(1, "a"), (3, "c"), (4, "d")]
        # The cause fixed: the entry is re-executed, out of order, in its own transaction.
        with sqlite3.connect(str(pair.target_path)) as tgt:
            tgt.execute("DROP INDEX one_v")
        retried = txrepl_cli("subscriber", "errors", "retry", "pub1.shop", seq, *ctl)
        assert retried.returncode == 0, retried.stderr
        assert _rows(pair.target_path) == _rows(pair.source_path)
        assert pair.status().level == head
        # Once: neither the CLI's retry nor a skip touches an applied entry.
        again = txrepl_cli("subscriber", "errors", "retry", "pub1.shop", seq, "--config", config)
        assert again.returncode == 1
        assert "already applied" in again.stderr
        skip = txrepl_cli("subscriber", "errors", "skip", "pub1.shop", seq, "--config", config)
        assert skip.returncode == 1
        assert "not yet applied" in skip.stderr
        # The daemon goes on from its level.
        src.execute("INSERT INTO t VALUES (5, 'e')")
        wait_until(lambda: (5, "e") in _rows(pair.target_path), 60, "the next entry")
        assert _rows(pair.target_path) == _rows(pair.source_path)
    finally:
        src.close()
        pair.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_subscription_broken_after_its_budget_then_unbroken(tmp_path: Path) -> None:
    pair = Pair(tmp_path, tables=["t"], subscription_extra={"retry_budget": 3})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    src.execute("INSERT INTO t VALUES (1, 'a')")
    address = f"127.0.0.1:{_free_port()}"  # nobody listens there yet
    pair.sub = Daemon(
        "subscriber",
        pair.write_subscriber_config(address),
        tmp_path / "subscriber" / "subscriber.addr",
        tmp_path / "subscriber.log",
    ).start()
    try:
        wait_until(lambda: pair.status().state == "broken", 60, "the subscription to break")
        assert "3 attempts in a row failed" in pair.status().last_error
        assert "subscription broken" in pair.sub.tail(200)
        with urllib.request.urlopen(f"http://{pair.sub.metrics_address}/metrics") as resp:
            metrics = resp.read().decode()
        assert 'txrepl_subscription_state{state="broken",subscription="pub1.shop"} 1.0' in metrics
        # Broken: no more attempts, even once the publisher is there.
        pair.start_publisher(listen=address)
        time.sleep(3)  # longer than the backoff's 1 s maximum
        out = txrepl_cli("subscriber", "status", "--control", pair.sub.address)
        assert "broken" in out.stdout
        assert pair.status().state == "broken"
        assert pair.status().sessions == 0
        unbroken = txrepl_cli("subscriber", "unbreak", "pub1.shop", "--control", pair.sub.address)
        assert unbroken.returncode == 0, unbroken.stderr
        pair.wait_caught_up()
        assert _rows(pair.target_path) == [(1, "a")]
    finally:
        src.close()
        pair.stop()
