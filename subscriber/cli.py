"""``txrepl subscriber ...`` subcommands: run, check, status, pause, resume, reconnect,
unbreak.

Every ``txrepl`` command registers these parsers, so each command imports what it
needs (the daemon, Spark, the RPC stubs) when it runs: the imports inside the
functions below defer heavy modules, they dodge no import circle.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import sys
from pathlib import Path
from typing import Any

import grpc

from common.errors import describe_rpc_error
from common.exits import rpc_failure
from common.jsonout import dump
from common.security import (
    ClientTls,
    add_client_args,
    client_channel,
    client_from_args,
    read_token_file,
)
from subscriber import conflicts_cli, errors_cli
from subscriber.extra import requires_extra

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("subscriber", help="run, check or control a subscriber daemon")
    psub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = psub.add_parser("run", help="run the subscriber daemon")
    run.add_argument("--config", required=True, help="subscriber TOML file")
    run.set_defaults(func=requires_extra(_run))
    check = psub.add_parser("check", help="validate a subscriber config without starting")
    check.add_argument("--config", required=True)
    check.set_defaults(func=_check)
    register_reinit(psub)
    errors_cli.register(psub)
    conflicts_cli.register(psub)
    for action, helptext in (
        ("status", "show each subscription's state, level and lag"),
        ("pause", "pause a subscription (or all)"),
        ("resume", "resume a paused subscription (or all)"),
        ("reconnect", "drop the connection and connect again now"),
        ("unbreak", "a broken subscription (retry budget spent) tries again now"),
    ):
        c = psub.add_parser(action, help=helptext)
        c.add_argument("--control", default="127.0.0.1:7401", help="control address host:port")
        if action != "status":
            c.add_argument("subscription", nargs="?", default="", help="default: all")
        c.add_argument("--json", action="store_true")
        add_client_args(c)
        c.set_defaults(func=_control, control_action=action)


def _run(args: argparse.Namespace) -> int:
    from common.trace import enable
    from subscriber.config import load_config
    from subscriber.daemon import run

    cfg = load_config(args.config)
    enable(cfg.trace_every, cfg.data_path)  # a diagnostic, off unless configured
    run(cfg)
    return 0


def _check(args: argparse.Namespace) -> int:
    from subscriber.config import load_config

    cfg = load_config(args.config)
    print(
        f"{args.config}: ok (subscriber {cfg.server_name}, {len(cfg.subscription)} subscriptions)"
    )
    return 0


def _control(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb
    from common.rpc import txrepl_pb2_grpc as rpc

    tls, token = client_from_args(args)
    stub = rpc.SubscriberControlStub(client_channel(args.control, tls, token=token))
    try:
        if args.control_action == "status":
            resp: Any = stub.Status(pb.StatusRequest(), timeout=10)
        else:
            method = {
                "pause": stub.Pause,
                "resume": stub.Resume,
                "reconnect": stub.Reconnect,
                "unbreak": stub.Unbreak,
            }[args.control_action]
            resp = method(pb.SubscriptionRequest(subscription=args.subscription), timeout=10)
    except grpc.RpcError as e:
        line, status = rpc_failure(e, plaintext=tls is None)
        print(f"txrepl: {line}", file=sys.stderr)
        return status
    if args.json:
        dump(resp)
        return 0
    print(
        f"{'SUBSCRIPTION':<24} {'STATE':<12} {'LEVEL':>10} {'HEAD':>10} {'LAG':>8}  SINCE / ERROR"
    )
    for s in resp.subscriptions:
        since = ""
        if s.timeline:
            at = dt.datetime.fromtimestamp(s.timeline[-1].at_us / 1e6, tz=dt.UTC)
            since = at.strftime("%H:%M:%S")
        print(
            f"{s.name:<24} {s.state:<12} {s.level:>10} {s.head:>10} "
            f"{max(0, s.head - s.level):>8}  {since} {s.last_error}"
        )
        if s.target_node:  # the target is a node: its own changes are not applied back
            print(f"    target node: {s.target_node}")
        if s.conflicts:  # an updatable subscription (docs/conflicts.md)
            print("    conflicts: " + ", ".join(f"{c.table} {c.count}" for c in s.conflicts))
        if s.HasField("snapshot"):
            p = s.snapshot
            eta = f"{p.eta_s:.0f} s" if p.eta_s >= 0 else "?"
            print(
                f"{'':<24} snapshot load ({p.by}): {p.rows_loaded:,}/{p.rows_expected:,} rows,"
                f" {p.rows_per_s:,.0f} rows/s, ETA {eta}"
            )
    return 0


def register_reinit(psub: Any) -> None:
    r = psub.add_parser(
        "reinit",
        help="re-initialise a subscription from a publisher snapshot, then mark it valid",
    )
    r.add_argument("subscription", help="subscription name (default name: PUBLISHER.PUBLICATION)")
    r.add_argument("--config", required=True, help="the subscriber's TOML file")
    r.add_argument("--no-mark-valid", action="store_true", help="leave the validity alone")
    r.add_argument(
        "--admin-token",
        default=os.environ.get("TXREPL_ADMIN_TOKEN", ""),
        help="the publisher's admin token, for mark-valid (default: $TXREPL_ADMIN_TOKEN)",
    )
    r.add_argument(
        "--admin-token-file", default="", help="file holding the publisher's admin token"
    )
    r.add_argument(
        "--control-token-file",
        default="",
        help="file holding the running subscriber's control (admin) token, to pause it",
    )
    r.add_argument(
        "--control-ca",
        default="",
        help="CA of the subscriber's control port when its [tls] is on (default: system roots)",
    )
    r.add_argument("--control-cert", default="", help="client certificate for its control port")
    r.add_argument("--control-key", default="", help="client key for its control port")
    r.set_defaults(func=requires_extra(_reinit))


def _listening(address: str) -> bool:
    """Whether something accepts TCP connections at ``address`` (host:port)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


def _reinit(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb
    from common.rpc import txrepl_pb2_grpc as rpc
    from subscriber.apply import create_spark_session
    from subscriber.config import load_config
    from subscriber.reinit import SnapshotError, SnapshotProgress
    from subscriber.reinit.progress import ProgressFile
    from subscriber.targets import (
        publisher_channel,
        resolve_token,
        snapshot_loader,
        snapshot_needs_spark,
        spark_settings,
    )

    cfg = load_config(args.config)
    sc = next((s for s in cfg.subscription if s.id == args.subscription), None)
    if sc is None:
        known = ", ".join(s.id for s in cfg.subscription) or "none"
        print(
            f"txrepl: no subscription {args.subscription!r} in {args.config} (known: {known})",
            file=sys.stderr,
        )
        return 2
    # The running daemon writes the address it bound (port 0 works) into its data dir.
    addr_file = cfg.data_path / "subscriber.addr"
    control_addr = addr_file.read_text().strip() if addr_file.exists() else cfg.control_listen
    control_tls = None
    if cfg.tls.enabled:  # the control port speaks TLS (mutual with client_ca_file)
        control_tls = ClientTls(args.control_ca, args.control_cert, args.control_key)
    control_token = ""
    if args.control_token_file:
        control_token = read_token_file(Path(args.control_token_file), "--control-token-file")
    try:
        control = rpc.SubscriberControlStub(
            client_channel(control_addr, control_tls, token=control_token)
        )
    except ValueError as e:
        print(f"txrepl: --control-ca/--control-cert/--control-key: {e}", file=sys.stderr)
        return 2
    admin_token = args.admin_token
    if args.admin_token_file:
        admin_token = read_token_file(Path(args.admin_token_file), "--admin-token-file")
    resolve_token(sc, cfg)  # an unreadable token_file stops here, before the daemon pauses
    daemon_running = True
    try:
        control.Pause(pb.SubscriptionRequest(subscription=sc.id), timeout=5)
        print(f"paused {sc.id} on the running subscriber ({control_addr})")
    except grpc.RpcError as e:
        # A daemon that answers (or only listens: TLS refused) but did not pause:
        # loading under it would race its apply.
        if e.code() != grpc.StatusCode.UNAVAILABLE or _listening(control_addr):
            hint = "" if control_token else " (its control token: --control-token-file)"
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                hint = " (a TLS control port: --control-ca, --control-cert/--control-key)"
            print(
                f"txrepl: cannot pause {sc.id} on the running subscriber ({control_addr}): "
                f"{describe_rpc_error(e)}; nothing was changed{hint}",
                file=sys.stderr,
            )
            return 1
        daemon_running = False
    # A PostgreSQL target is loaded by COPY from this process: no Spark session needed,
    # unless a table is shaped by transforms (subscriber/reinit/shape.py).
    spark = create_spark_session(spark_settings(cfg)) if snapshot_needs_spark(cfg) else None

    shown = ProgressFile(cfg.data_path, sc.id)  # for the daemon's status meanwhile

    def progress(p: SnapshotProgress) -> None:
        shown.report(p)
        total = max(1, p.rows_expected)
        width = 30
        done = int(width * p.rows_loaded / total)
        eta = f"{p.eta_s:.0f}s" if p.eta_s is not None else "?"
        print(
            f"\r[{'#' * done}{'.' * (width - done)}] {p.rows_loaded}/{p.rows_expected} rows "
            f"{p.rate:,.0f} rows/s ETA {eta}   ",
            end="",
            flush=True,
        )

    try:
        # The daemon's builder: the same token (token_file too), role, tables and Spark.
        incarnation, seq = snapshot_loader(cfg, sc, spark, on_progress=progress)()
    except SnapshotError as e:
        print(f"\ntxrepl: {e} (the target is unchanged)", file=sys.stderr)
        return 1
    finally:
        shown.remove()
        if spark is not None:
            spark.stop()
    print(f"\nloaded snapshot of {sc.publication!r} as of seq {seq} (incarnation {incarnation})")
    if not args.no_mark_valid:
        # The subscription's TLS, the publisher's admin token.
        admin = rpc.AdminStub(publisher_channel(cfg, sc, token=admin_token))
        try:
            admin.MarkValid(
                pb.MarkValidRequest(
                    publication=sc.publication, subscriber=cfg.server_name, level=seq
                ),
                timeout=10,
            )
        except grpc.RpcError as e:
            print(f"txrepl: mark-valid failed: {describe_rpc_error(e)}", file=sys.stderr)
            return 1
        print(f"marked {cfg.server_name} valid on {sc.publisher} at level {seq}")
    if daemon_running:
        control.Resume(pb.SubscriptionRequest(subscription=sc.id), timeout=5)
        print(f"resumed {sc.id}")
    return 0
