"""``txrepl config check FILE``: validate either daemon's config without starting it.

Which daemon a file configures is told by its keys (``source``/``publication``:
publisher; ``target``/``subscription``: subscriber, or ``--kind``).  The loaders
come from the ``txrepl.config_kinds`` entry point group, so this module knows
no daemon (see pyproject.toml).  Environment overrides apply, as at start.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from common.config import ConfigError

__all__ = ["detect_kind", "register"]

_PUBLISHER_KEYS = {"source", "publication", "listen", "log", "subscriber"}
_SUBSCRIBER_KEYS = {"target", "subscription", "control_listen", "spark", "batch", "backoff"}


def detect_kind(data: dict[str, Any], source: str) -> str:
    keys = {k.replace("-", "_") for k in data}
    pub, sub = len(keys & _PUBLISHER_KEYS), len(keys & _SUBSCRIBER_KEYS)
    if "source" in keys or (pub > sub and "target" not in keys):
        return "publisher"
    if "target" in keys or sub > pub:
        return "subscriber"
    raise ConfigError(
        source,
        "",
        "cannot tell which daemon this configures: a publisher config has 'source', "
        "a subscriber config has 'target' (or pass --kind)",
    )


def register(sub: Any) -> None:
    c = sub.add_parser("config", help="validate configuration files")
    csub = c.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = csub.add_parser("check", help="validate a publisher or subscriber config")
    check.add_argument("file")
    check.add_argument("--kind", choices=["publisher", "subscriber"], default="")
    check.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    path = Path(args.file)
    kind = args.kind
    if not kind:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(str(path), "", "file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(str(path), "", f"not valid TOML: {e}") from None
        kind = detect_kind(data, str(path))
    loaders = {ep.name: ep for ep in entry_points(group="txrepl.config_kinds")}
    if kind not in loaders:
        print(f"txrepl: no {kind} installed to check {path}", file=sys.stderr)
        return 2
    cfg = loaders[kind].load()(path)
    name = getattr(cfg, "server_name", "?")
    print(f"{path}: ok ({kind} {name})")
    return 0
