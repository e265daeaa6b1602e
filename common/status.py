"""``txrepl status``: what a publisher (and optionally a subscriber) is doing, at a glance.

It talks to the publisher's Admin service and, with ``--subscriber``, to a
subscriber's control service, through the generated stubs in ``common/rpc``
only (so it knows neither daemon's code).  Two samples ``--sample`` seconds
apart measure each subscriber's catch-up rate; the ETA to in sync is the lag
divided by how fast the lag shrinks (level rate minus head rate), and is
unknown ("-") while the lag does not shrink.  ``--watch`` redraws the tables
with a progress bar per catching-up subscriber; ``--json`` prints one document
for scripts.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import grpc

from common.exits import rpc_failure
from common.jsonout import dump, message_dict
from common.rpc import txrepl_pb2 as pb
from common.rpc import txrepl_pb2_grpc as rpc
from common.security import ClientTls, add_client_args, client_channel, client_from_args

__all__ = ["Snapshot", "collect", "register", "render", "to_json"]


@dataclass
class Snapshot:
    at: float
    publisher: str
    publications: list[pb.PublicationInfo]
    subscribers: list[pb.SubscriberInfo]
    subscriber_name: str = ""
    subscriptions: list[pb.SubscriptionStatus] = field(default_factory=list)
    node: str = ""  # the publisher's source as a node (docs/topologies.md)

    def target_nodes(self) -> list[str]:
        """The nodes the subscriber's targets are (one target per daemon: one at most)."""
        return sorted({t.target_node for t in self.subscriptions if t.target_node})

    def head(self, publication: str) -> int:
        return next((int(p.head) for p in self.publications if p.name == publication), 0)


@dataclass
class Progress:
    """Catch-up of one subscriber between two snapshots."""

    rate: float | None = None  # entries applied per second
    eta_s: float | None = None  # seconds to in sync; 0 when in sync
    start_level: int = 0


def collect(
    publisher: str,
    subscriber: str,
    *,
    tls: ClientTls | None = None,
    token: str = "",
    timeout: float = 10.0,
) -> Snapshot:
    with client_channel(publisher, tls, token=token) as ch:
        admin = rpc.AdminStub(ch)
        pubs = admin.ListPublications(pb.ListPublicationsRequest(), timeout=timeout)
        subs = admin.ListSubscribers(pb.ListSubscribersRequest(), timeout=timeout)
    snap = Snapshot(time.time(), pubs.publisher, list(pubs.publications), list(subs.subscribers))
    snap.node = pubs.node
    if subscriber:
        with client_channel(subscriber, tls, token=token) as ch:
            st = rpc.SubscriberControlStub(ch).Status(pb.StatusRequest(), timeout=timeout)
        snap.subscriber_name = st.subscriber
        snap.subscriptions = list(st.subscriptions)
    return snap


def measure(
    first: Snapshot, last: Snapshot, previous: dict[tuple[str, str], Progress] | None = None
) -> dict[tuple[str, str], Progress]:
    """Catch-up rate and ETA of each subscriber from ``first`` to ``last``."""
    out: dict[tuple[str, str], Progress] = {}
    before = {(s.publication, s.subscriber): s for s in first.subscribers}
    dt = last.at - first.at
    for s in last.subscribers:
        key = (s.publication, s.subscriber)
        prog = Progress(start_level=int(s.level))
        if previous and key in previous:
            prog.start_level = previous[key].start_level
        if s.lag_entries == 0:
            prog.eta_s = 0.0
        old = before.get(key)
        if old is not None and dt > 0:
            prog.rate = (s.level - old.level) / dt
            head_rate = (last.head(s.publication) - first.head(s.publication)) / dt
            closing = prog.rate - head_rate
            if s.lag_entries and closing > 0:
                prog.eta_s = s.lag_entries / closing
        out[key] = prog
    return out


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s == 0:
        return "in sync"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m{s % 60:02.0f}s"
    return f"{s // 3600:.0f}h{(s % 3600) // 60:02.0f}m"


def bar(done: int, total: int, width: int = 24) -> str:
    frac = 1.0 if total <= 0 else max(0.0, min(1.0, done / total))
    full = round(frac * width)
    return f"[{'#' * full}{'.' * (width - full)}] {frac * 100:5.1f}%"


def _node(name: str) -> str:
    """The header's node note: where a node is configured or recorded."""
    return f"  (node {name})" if name else ""


def render(snap: Snapshot, progress: dict[tuple[str, str], Progress], *, bars: bool = False) -> str:
    lines = [f"publisher {snap.publisher}" + _node(snap.node), ""]
    lines.append(
        f"{'PUBLICATION':<16} {'HEAD':>10} {'RETAINED':>23} {'LOG SIZE':>11} {'SUBSCRIBERS':>11}"
        "  CAPTURE"
    )
    for p in snap.publications:
        retained = f"{p.first_retained}..{p.head}" if p.head >= p.first_retained else "(empty)"
        n = sum(1 for s in snap.subscribers if s.publication == p.name)
        capture = f"FAILING: {p.capture_error}" if p.capture_failing else "ok"
        lines.append(
            f"{p.name:<16} {p.head:>10} {retained:>23} {_bytes(p.log_bytes):>11} {n:>11}  {capture}"
        )
    lines.append("")
    lines.append(
        f"{'PUBLICATION':<16} {'SUBSCRIBER':<16} {'LEVEL':>10} {'LAG':>8} {'LAG S':>8} "
        f"{'STATE':<12} {'VALID':<5} {'RATE/S':>8} {'ETA':>8}  LAST CUT"
    )
    if not snap.subscribers:
        lines.append("(no subscriber has synced yet)")
    for s in snap.subscribers:
        prog = progress.get((s.publication, s.subscriber), Progress())
        rate = "-" if prog.rate is None else f"{prog.rate:.0f}"
        lines.append(
            f"{s.publication:<16} {s.subscriber:<16} {s.level:>10} {s.lag_entries:>8} "
            f"{s.lag_seconds:>8.1f} {s.state:<12} {'yes' if s.valid else 'NO':<5} {rate:>8} "
            f"{_duration(prog.eta_s):>8}  {s.last_cut_reason}"
        )
        if bars and s.lag_entries:
            head = s.level + s.lag_entries
            done = s.level - prog.start_level
            lines.append(f"    {bar(done, head - prog.start_level)}  {s.level}/{head}")
    if snap.subscriber_name:
        lines.append("")
        lines.append(f"subscriber {snap.subscriber_name}" + _node(", ".join(snap.target_nodes())))
        lines.append(
            f"{'SUBSCRIPTION':<24} {'STATE':<12} {'LEVEL':>10} {'HEAD':>10} {'LAG':>8}  LAST ERROR"
        )
        for t in snap.subscriptions:
            lag = max(0, t.head - t.level)
            lines.append(
                f"{t.name:<24} {t.state:<12} {t.level:>10} {t.head:>10} {lag:>8}  {t.last_error}"
            )
    return "\n".join(lines)


def to_json(snap: Snapshot, progress: dict[tuple[str, str], Progress]) -> dict[str, Any]:
    """The ``--json`` document, in the style of every command (common/jsonout.py)."""
    subscribers = []
    for s in snap.subscribers:
        row = message_dict(s)
        prog = progress.get((s.publication, s.subscriber), Progress())
        row["rate_entries_per_s"] = prog.rate
        row["eta_s"] = prog.eta_s
        subscribers.append(row)
    publications = [message_dict(p) for p in snap.publications]
    out: dict[str, Any] = {
        "at": snap.at,
        "publisher": snap.publisher,
        "node": snap.node,
        "publications": publications,
        "subscribers": subscribers,
    }
    if snap.subscriber_name:
        subs = []
        for t in snap.subscriptions:
            row = message_dict(t)
            row.pop("timeline", None)
            subs.append(row)
        out["subscriber"] = {"name": snap.subscriber_name, "subscriptions": subs}
    return out


def register(sub: Any) -> None:
    s = sub.add_parser(
        "status",
        help="publications, subscribers, lag and ETA of a running publisher (and subscriber)",
    )
    s.add_argument("--publisher", default="127.0.0.1:7400", help="publisher address host:port")
    s.add_argument("--subscriber", default="", help="also show this subscriber's control status")
    s.add_argument("--json", action="store_true", help="one JSON document")
    s.add_argument("--watch", action="store_true", help="redraw with progress bars until ^C")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between redraws")
    s.add_argument("--count", type=int, default=0, help="with --watch: stop after N redraws")
    s.add_argument(
        "--sample",
        type=float,
        default=1.0,
        help="seconds between the two samples that measure catch-up rates (0: one sample)",
    )
    add_client_args(s)
    s.set_defaults(func=main)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    tls, token = client_from_args(args)

    def take() -> Snapshot:
        return collect(args.publisher, args.subscriber, tls=tls, token=token)

    try:
        first = take()
        if args.watch:
            return _watch(first, take, args, out)
        last = first
        if args.sample > 0 and any(s.lag_entries for s in first.subscribers):
            time.sleep(args.sample)
            last = take()
        progress = measure(first, last)
    except grpc.RpcError as e:
        line, status = rpc_failure(e, plaintext=tls is None)
        print(f"txrepl: {line}", file=sys.stderr)
        return status
    if args.json:
        dump(to_json(last, progress), out)
    else:
        print(render(last, progress), file=out)
    return 0


def _watch(first: Snapshot, take: Any, args: argparse.Namespace, out: TextIO) -> int:
    tty = out.isatty()
    progress = measure(first, first)
    prev = first
    n = 0
    try:
        while True:
            text = render(prev, progress, bars=True)
            if tty:
                out.write("\x1b[H\x1b[2J")
            out.write(text + "\n\n")
            out.flush()
            n += 1
            if args.count and n >= args.count:
                return 0
            time.sleep(args.interval)
            snap = take()
            progress = measure(prev, snap, progress)
            prev = snap
    except KeyboardInterrupt:
        return 0
