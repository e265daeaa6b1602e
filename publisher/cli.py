"""``txrepl publisher ...`` and ``txrepl admin ...`` subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import grpc

from common.exits import rpc_failure
from common.jsonout import dump
from common.security import add_client_args, client_channel, client_from_args

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("publisher", help="run or check the publisher daemon")
    psub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = psub.add_parser("run", help="run the publisher daemon")
    run.add_argument("--config", required=True, help="publisher TOML file")
    run.set_defaults(func=_run)
    check = psub.add_parser("check", help="validate a publisher config without starting")
    check.add_argument("--config", required=True)
    check.set_defaults(func=_check)

    a = sub.add_parser("admin", help="administer a running publisher")
    a.add_argument("--publisher", default="127.0.0.1:7400", help="publisher address host:port")
    asub = a.add_subparsers(dest="action", metavar="ACTION", required=True)
    subs = asub.add_parser("subscribers", help="list subscribers with level, lag, state")
    subs.add_argument("--publication", default="")
    subs.add_argument("--json", action="store_true")
    subs.set_defaults(func=_subscribers)
    pubs = asub.add_parser("publications", help="list publications with head and log size")
    pubs.add_argument("--json", action="store_true")
    pubs.set_defaults(func=_publications)
    mv = asub.add_parser("mark-valid", help="mark an invalid subscriber valid again")
    mv.add_argument("publication")
    mv.add_argument("subscriber")
    mv.add_argument("--level", type=int, default=0, help="set its level too (after a reinit)")
    mv.add_argument("--json", action="store_true")
    mv.set_defaults(func=_mark_valid)
    drop = asub.add_parser(
        "drop-subscriber",
        help="remove a subscriber's registry row, so it no longer holds the log back",
    )
    drop.add_argument("publication")
    drop.add_argument("subscriber")
    drop.add_argument("--json", action="store_true")
    drop.set_defaults(func=_drop)
    inv = asub.add_parser(
        "invalidate", help="mark a subscriber invalid: it stops holding the log, needs a reinit"
    )
    inv.add_argument("publication")
    inv.add_argument("subscriber")
    inv.add_argument("--reason", default="", help="recorded with the invalidation")
    inv.add_argument("--json", action="store_true")
    inv.set_defaults(func=_invalidate)
    refresh = asub.add_parser(
        "refresh-snapshot", help="evaluate a query snapshot now (Virtuoso UPDATE SNAPSHOT)"
    )
    refresh.add_argument("publication")
    refresh.add_argument("table")
    refresh.add_argument("--json", action="store_true")
    refresh.set_defaults(func=_refresh_snapshot)
    dsnap = asub.add_parser(
        "drop-snapshot",
        help="stop refreshing a query snapshot (Virtuoso DROP SNAPSHOT [WITH DELETE])",
    )
    dsnap.add_argument("publication")
    dsnap.add_argument("table")
    dsnap.add_argument(
        "--with-delete", action="store_true", help="drop the table on every subscriber too"
    )
    dsnap.add_argument("--json", action="store_true")
    dsnap.set_defaults(func=_drop_snapshot)
    for leaf in (subs, pubs, mv, drop, inv, refresh, dsnap):
        # Also after the action (`txrepl admin subscribers --publisher H:P`); given in
        # neither place, the default above holds.
        leaf.add_argument(
            "--publisher", default=argparse.SUPPRESS, help="publisher address host:port"
        )
        add_client_args(leaf)


def _run(args: argparse.Namespace) -> int:
    # Deferred, not a circle: the daemon pulls in the gRPC server, psycopg and the
    # capture packages, which the client subcommands of this CLI never need.
    from common.trace import enable
    from publisher.config import load_config
    from publisher.daemon import run
    from publisher.errors import RegistryError, SourceError

    cfg = load_config(args.config)
    enable(cfg.trace_every, cfg.data_path)  # a diagnostic, off unless configured
    try:
        run(cfg)
    except (SourceError, RegistryError) as e:
        print(f"txrepl: publisher cannot start: {e}", file=sys.stderr)
        return 1
    return 0


def _check(args: argparse.Namespace) -> int:
    from publisher.config import load_config

    cfg = load_config(args.config)
    print(f"{args.config}: ok (publisher {cfg.server_name}, {len(cfg.publication)} publications)")
    return 0


def _admin_stub(args: argparse.Namespace) -> Any:
    from common.rpc import txrepl_pb2_grpc as rpc

    tls, token = client_from_args(args)
    args.plaintext = tls is None
    return rpc.AdminStub(client_channel(args.publisher, tls, token=token))


def _call(fn: Any, request: Any, args: argparse.Namespace) -> Any:
    try:
        return fn(request, timeout=10)
    except grpc.RpcError as e:
        line, status = rpc_failure(e, plaintext=args.plaintext)
        print(f"txrepl: {line}", file=sys.stderr)
        raise SystemExit(status) from None


def _subscribers(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb

    resp = _call(
        _admin_stub(args).ListSubscribers,
        pb.ListSubscribersRequest(publication=args.publication),
        args,
    )
    if args.json:
        dump(resp)
        return 0
    header = f"{'PUBLICATION':<16} {'SUBSCRIBER':<16} {'LEVEL':>10} {'LAG':>8} {'LAG S':>8} "
    header += f"{'STATE':<12} {'VALID':<5} {'CUTS':>4}  LAST CUT / INVALID REASON"
    print(header)
    for s in resp.subscribers:
        print(
            f"{s.publication:<16} {s.subscriber:<16} {s.level:>10} {s.lag_entries:>8} "
            f"{s.lag_seconds:>8.1f} {s.state:<12} {'yes' if s.valid else 'NO':<5} {s.cuts:>4}  "
            f"{s.last_cut_reason}"
        )
    return 0


def _publications(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb

    resp = _call(_admin_stub(args).ListPublications, pb.ListPublicationsRequest(), args)
    if args.json:
        dump(resp)
        return 0
    print(f"publisher {resp.publisher}")
    print(f"{'PUBLICATION':<16} {'HEAD':>10} {'FIRST':>10} {'LOG BYTES':>12}  TABLES")
    for p in resp.publications:
        print(
            f"{p.name:<16} {p.head:>10} {p.first_retained:>10} {p.log_bytes:>12}  "
            f"{', '.join(p.tables)}"
        )
    return 0


def _one_subscriber(
    args: argparse.Namespace, method: str, request: Any, says: Callable[[Any], str]
) -> int:
    """Call the Admin ``method`` about one subscriber; print ``says(its info)``, or --json."""
    resp = _call(getattr(_admin_stub(args), method), request, args)
    if args.json:
        dump(resp)
    else:
        print(says(resp.subscriber))
    return 0


def _mark_valid(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb

    request = pb.MarkValidRequest(
        publication=args.publication, subscriber=args.subscriber, level=args.level
    )
    return _one_subscriber(
        args,
        "MarkValid",
        request,
        lambda s: f"{s.subscriber} on {s.publication}: valid, level {s.level}",
    )


def _drop(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb

    request = pb.DropSubscriberRequest(publication=args.publication, subscriber=args.subscriber)
    return _one_subscriber(
        args,
        "DropSubscriber",
        request,
        lambda s: (
            f"{s.subscriber} on {s.publication}: dropped (it was at level {s.level}, "
            f"{s.lag_entries} behind); it no longer holds the log back"
        ),
    )


def _refresh_snapshot(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb

    request = pb.RefreshSnapshotRequest(publication=args.publication, table=args.table)
    resp = _call(_admin_stub(args).RefreshSnapshot, request, args)
    if args.json:
        dump(resp)
    else:
        print(f"{args.publication}.{args.table}: refreshed, {resp.rows} rows (head {resp.head})")
    return 0


def _drop_snapshot(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb

    request = pb.DropSnapshotRequest(
        publication=args.publication, table=args.table, with_delete=args.with_delete
    )
    resp = _call(_admin_stub(args).DropSnapshot, request, args)
    if args.json:
        dump(resp)
    else:
        what = "dropped on the subscribers too" if args.with_delete else "kept on the subscribers"
        print(
            f"{args.publication}.{args.table}: no longer refreshed, the table {what} "
            "(remove it from the publisher's config too, or the next start refreshes it again)"
        )
    return 0


def _invalidate(args: argparse.Namespace) -> int:
    from common.rpc import txrepl_pb2 as pb

    request = pb.InvalidateSubscriberRequest(
        publication=args.publication, subscriber=args.subscriber, reason=args.reason
    )
    return _one_subscriber(
        args,
        "InvalidateSubscriber",
        request,
        lambda s: (
            f"{s.subscriber} on {s.publication}: invalid at level {s.level}; it no longer "
            "holds the log back (re-initialise it: txrepl subscriber reinit, which marks it "
            "valid)"
        ),
    )
