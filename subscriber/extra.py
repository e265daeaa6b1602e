"""The ``subscriber`` extra: what only the subscriber needs, and one line when it is missing.

``pip install txrepl`` installs the publisher, the ``txrepl`` command and this package's
light parts (config, control client); Spark and the columnar stack it applies with come
with ``pip install 'txrepl[subscriber]'`` (pyproject.toml, ``[project.optional-
dependencies] subscriber``), so a publisher host or image does not carry them
(docs/operations.md, "Installing").  A subscriber command that needs them, run without
them, must say so in one line instead of a ``ModuleNotFoundError`` traceback: wrap its
parser's ``func`` with :func:`requires_extra`.

``MODULES`` lists the top-level modules of the extra's distributions; the publisher's
import graph must import none of them (tests/integration/publisher/
test_publisher_without_spark.py blocks them and runs a publisher).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from collections.abc import Callable

__all__ = ["INSTALL_HINT", "MODULES", "missing_modules", "requires_extra"]

# Top-level modules of the distributions in the `subscriber` extra (pyproject.toml).
MODULES = ("pyspark", "pyarrow", "pandas", "numpy")
INSTALL_HINT = "pip install 'txrepl[subscriber]'"
# The status of an operator error the CLI reports in one line (as a configuration error).
EXIT_STATUS = 2


def missing_modules() -> list[str]:
    """The extra's modules this interpreter cannot import (none when it is installed)."""
    missing = []
    for name in MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def requires_extra(
    func: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """``func``, refusing in one line (exit status 2) when the extra is not installed."""

    @functools.wraps(func)
    def checked(args: argparse.Namespace) -> int:
        missing = missing_modules()
        if missing:
            print(
                f"txrepl: this command needs the subscriber's Spark packages, not installed "
                f"here (missing: {', '.join(missing)}): {INSTALL_HINT}",
                file=sys.stderr,
            )
            return EXIT_STATUS
        return func(args)

    return checked
