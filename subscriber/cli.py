"""``txrepl subscriber ...`` subcommands: run, check, status, pause, resume, reconnect."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

import grpc

from common.errors import describe_rpc_error

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("subscriber", help="run, check or control a subscriber daemon")
    psub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = psub.add_parser("run", help="run the subscriber daemon")
    run.add_argument("--config", required=True, help="subscriber TOML file")
    run.set_defaults(func=_run)
    check = psub.add_parser("check", help="validate a subscriber config without starting")
    check.add_argument("--config", required=True)
    check.set_defaults(func=_check)
    for action, helptext in (
        ("status", "show each subscription's state, level and lag"),
        ("pause", "pause a subscription (or all)"),
        ("resume", "resume a paused subscription (or all)"),
        ("reconnect", "drop the connection and connect again now"),
    ):
        c = psub.add_parser(action, help=helptext)
        c.add_argument("--control", default="127.0.0.1:7401", help="control address host:port")
        if action != "status":
            c.add_argument("subscription", nargs="?", default="", help="default: all")
        c.add_argument("--json", action="store_true")
        c.set_defaults(func=_control, control_action=action)


def _run(args: argparse.Namespace) -> int:
    from subscriber.config import load_config
    from subscriber.daemon import run

    run(load_config(args.config))
    return 0


def _check(args: argparse.Namespace) -> int:
    from subscriber.config import load_config

    cfg = load_config(args.config)
    print(
        f"{args.config}: ok (subscriber {cfg.server_name}, {len(cfg.subscription)} subscriptions)"
    )
    return 0


def _control(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from common.rpc import txrepl_pb2 as pb
    from common.rpc import txrepl_pb2_grpc as rpc

    stub = rpc.SubscriberControlStub(grpc.insecure_channel(args.control))
    try:
        if args.control_action == "status":
            resp: Any = stub.Status(pb.StatusRequest(), timeout=10)
        else:
            method = {"pause": stub.Pause, "resume": stub.Resume, "reconnect": stub.Reconnect}[
                args.control_action
            ]
            resp = method(pb.SubscriptionRequest(subscription=args.subscription), timeout=10)
    except grpc.RpcError as e:
        print(f"txrepl: {describe_rpc_error(e)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(MessageToDict(resp, always_print_fields_with_no_presence=True), indent=2))
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
    return 0
