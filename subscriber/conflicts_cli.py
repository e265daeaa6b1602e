"""``txrepl subscriber conflicts``: the target's conflict log (updatable subscriptions).

Reads the subscriber config for the target URL; needs no running daemon and no
Spark.  One line per conflict, or ``--json`` in the style of every command
(common/jsonout.py): ``{"conflicts": [...]}``, the log's columns as keys, the rows
as their JSON text.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from common.jsonout import dump

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("conflicts", help="the conflict log of updatable subscriptions")
    p.add_argument("--config", required=True, help="subscriber TOML file")
    p.add_argument("subscription", nargs="?", default=None)
    p.add_argument("--table", default=None, help="only this source table")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    from subscriber.apply.errors import WriterError
    from subscriber.config import load_config
    from subscriber.targets.conflicts import read_conflicts

    cfg = load_config(args.config)
    try:
        records = read_conflicts(cfg.target_url, args.subscription, args.table)
    except WriterError as e:
        print(f"txrepl: {e}", file=sys.stderr)
        return 1
    if args.json:
        dump({"conflicts": [r.__dict__ for r in records]})
        return 0
    print(
        f"{'ID':>6} {'SUBSCRIPTION':<20} {'SEQ':>8} {'TABLE':<16} {'KIND':<16} "
        f"{'DECISION':<14} KEY  PUBLISHER / LOCAL / APPLIED"
    )
    for r in records:
        print(
            f"{r.id:>6} {r.subscription:<20} {r.seq:>8} {r.table_name:<16} {r.kind:<16} "
            f"{r.decision:<14} {r.row_key}  {r.publisher_row} / {r.local_row} / {r.applied_row}"
        )
    return 0
