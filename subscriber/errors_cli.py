"""``txrepl subscriber errors list|retry|skip``: stored apply errors.

``--config``: on the target directly.  Reads the subscriber config for the target URL
and ``[apply]`` settings; needs no running daemon (``retry`` starts a local Spark
session to apply the entry).  After ``retry`` or ``skip``, reconnect the subscription
so the daemon re-reads its level.  ``--control``: the running daemon does it through
its control service (``ListErrors``, ``RetryError``, ``SkipError``), with its own Spark
session and level; TLS and token options as for ``txrepl subscriber status``.
Hook it into ``subscriber/cli.py`` with ``errors_cli.register(psub)``.  The imports
inside the functions defer Spark and the targets' drivers to the command that runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from common.exits import rpc_failure
from common.jsonout import dump
from common.security import add_client_args, client_channel, client_from_args
from subscriber.extra import requires_extra

__all__ = ["register"]


def _where(parser: Any) -> None:
    """``--config`` (the target directly) or ``--control`` (the running daemon)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="subscriber TOML file: act on the target directly")
    where.add_argument(
        "--control", help="a running subscriber's control address host:port: the daemon acts"
    )
    add_client_args(parser)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("errors", help="list, retry or skip stored apply errors")
    actions = p.add_subparsers(dest="errors_action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="stored errors (all subscriptions, or one)")
    _where(ls)
    ls.add_argument("subscription", nargs="?", default=None)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_by_control(requires_extra(_list)))
    for name, helptext in (
        ("retry", "apply the stored entry now (after fixing the target); re-execute a skipped one"),
        ("skip", "move the level past the stored entry without applying it"),
    ):
        c = actions.add_parser(name, help=helptext)
        _where(c)
        c.add_argument("subscription")
        c.add_argument("seq", type=int)
        c.set_defaults(func=_by_control(requires_extra(_retry if name == "retry" else _skip)))


def _by_control(direct: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The command as given: on the target (``--config``) or through the daemon's
    control service (``--control``: ListErrors, RetryError, SkipError)."""

    def run(args: argparse.Namespace) -> int:
        return _control(args) if args.control else direct(args)

    return run


def _control(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb
    from common.rpc import txrepl_pb2_grpc as rpc

    tls, token = client_from_args(args)
    stub = rpc.SubscriberControlStub(client_channel(args.control, tls, token=token))
    action = args.errors_action
    try:
        if action == "list":
            resp = stub.ListErrors(
                pb.SubscriptionRequest(subscription=args.subscription or ""), timeout=30
            )
        else:
            call = stub.RetryError if action == "retry" else stub.SkipError
            request = pb.ErrorRequest(subscription=args.subscription, seq=args.seq)
            call(request, timeout=300)  # a retry applies the entry: Spark may start
    except grpc.RpcError as e:
        line, status = rpc_failure(e, plaintext=tls is None)
        print(f"txrepl: {line}", file=sys.stderr)
        return status
    if action != "list":
        print(f"{args.subscription}: entry {args.seq} {action}: done by the daemon")
        return 0
    if args.json:
        fields = ("subscription", "seq", "status", "error", "created_at")  # as --config's
        dump({"errors": [{f: getattr(e, f) for f in fields} for e in resp.errors]})
        return 0
    _print_errors(resp.errors)
    return 0


def _print_errors(errors: Iterable[Any]) -> None:
    print(f"{'SUBSCRIPTION':<24} {'SEQ':>10} {'STATUS':<8} {'CREATED':<32} ERROR")
    for e in errors:
        print(f"{e.subscription:<24} {e.seq:>10} {e.status:<8} {e.created_at:<32} {e.error}")


def _writer(args: argparse.Namespace) -> Any:
    from subscriber.config import load_config
    from subscriber.targets import attach_conflicts, open_writer

    cfg = load_config(args.config)
    writer = open_writer(cfg.target_url, cfg.apply)
    attach_conflicts(writer, cfg.subscription)  # a retried entry is checked as the daemon does
    return cfg, writer


def _list(args: argparse.Namespace) -> int:
    _, writer = _writer(args)
    errors = writer.list_errors(args.subscription)
    if args.json:  # the style of every --json (common/jsonout.py): an object at the top
        dump({"errors": [{**e.__dict__, "entry": e.entry.hex()} for e in errors]})
        return 0
    _print_errors(errors)
    return 0


def _skip(args: argparse.Namespace) -> int:
    from subscriber.apply import ApplyError

    _, writer = _writer(args)
    try:
        level = writer.skip_error(args.subscription, args.seq)
    except ApplyError as e:
        print(f"txrepl: {e}", file=sys.stderr)
        return 1
    print(f"{args.subscription}: entry {args.seq} skipped; level {level}")
    return 0


def _retry(args: argparse.Namespace) -> int:
    from subscriber.apply import Applier, ApplyError, SparkSettings, create_spark_session
    from subscriber.apply.stored import retry_error
    from subscriber.targets import updatable_options

    cfg, writer = _writer(args)
    spark = create_spark_session(SparkSettings(master="local[1]", jars=tuple(cfg.spark.jars)))
    try:
        applier = Applier(spark, writer, args.subscription)
        applier.configure(updatable_options(cfg.apply, *cfg.subscription))
        result = retry_error(applier, args.seq)
    except ApplyError as e:
        print(f"txrepl: {e}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print(f"{args.subscription}: entry {args.seq} applied; level {result.level}")
    return 0
