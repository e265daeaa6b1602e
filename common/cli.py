"""The ``txrepl`` command: a thin dispatcher.

It knows no daemon.  Each installed part registers its subcommands through the
``txrepl.commands`` entry point group (see pyproject.toml): the entry point is
a function ``register(subparsers)`` that adds its parsers and sets
``func=callable(args) -> int`` on them.  Operator errors a command lets through
end here in one line and the exit status of their class (common.exits).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version

# grpc's C core logs a failed TLS handshake to stderr on its own (a second line under
# ours); read once, when grpc is first imported, so set before any import of it.
# GRPC_VERBOSITY=debug (or info) in the environment still shows everything.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from common import exits
from common.config import ConfigError, UnreadableFileError
from common.errors import ListenError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txrepl", description="Transactional replication for SQL databases."
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    parser.add_argument(
        "--log-format",
        choices=["auto", "json", "console"],
        default="auto",
        help="log format (auto: JSON unless stderr is a terminal)",
    )
    parser.add_argument("--version", action="version", version=f"txrepl {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for ep in sorted(entry_points(group="txrepl.commands"), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def _version() -> str:
    """The installed distribution's version (package metadata, not a constant here)."""
    try:
        return version("txrepl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    from common.logging import configure_logging

    fmt = {"auto": None, "json": True, "console": False}[args.log_format]
    configure_logging(args.log_level, json=fmt)
    try:
        return int(func(args) or 0)
    except UnreadableFileError as e:
        print(f"txrepl: {e}", file=sys.stderr)
        return exits.UNREADABLE_FILE
    except ConfigError as e:
        print(f"txrepl: configuration error: {e}", file=sys.stderr)
        return exits.CONFIG
    except ListenError as e:
        print(f"txrepl: {e}", file=sys.stderr)
        return exits.PORT_BUSY
    except KeyboardInterrupt:
        return exits.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
