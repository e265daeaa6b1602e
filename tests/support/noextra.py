"""An interpreter without the ``subscriber`` extra, for the publisher-without-Spark tests.

:func:`extra_modules` reads the extra's distributions from pyproject.toml and maps them
to their top-level modules (through the installed distributions' metadata).
:func:`blocking_env` writes a ``sitecustomize.py`` that makes those modules unimportable
in any Python process started with the returned environment, and records each attempt
to import one (with the importer's stack) in ``attempts.log.<pid>`` beside it: a
publisher that swallowed the ImportError would still show up there.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

from tests.support.harness import ROOT

_SITECUSTOMIZE = """\
import importlib.abc
import os
import sys
import traceback

BLOCKED = {blocked!r}
LOG = {log!r}


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            with open(LOG + "." + str(os.getpid()), "a") as f:
                f.write("import " + name + "\\n" + "".join(traceback.format_stack(limit=12)))
            raise ModuleNotFoundError("No module named " + repr(name), name=name)
        return None


sys.meta_path.insert(0, _Blocker())
"""


def extra_distributions() -> list[str]:
    """Distribution names in pyproject.toml's ``subscriber`` extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r).name for r in project["optional-dependencies"]["subscriber"]]


def extra_modules() -> set[str]:
    """Top-level modules of the extra's distributions (installed in the test venv)."""
    wanted = {d.lower() for d in extra_distributions()}
    return {
        module
        for module, dists in packages_distributions().items()
        if any(d.lower() in wanted for d in dists) and not module.startswith("_")
    }


def blocking_env(directory: Path) -> tuple[dict[str, str], Path]:
    """(environment, attempts log prefix) for processes that cannot import the extra's
    modules; ``attempts(prefix)`` reads what they tried."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "attempts.log"
    (directory / "sitecustomize.py").write_text(
        _SITECUSTOMIZE.format(blocked=sorted(extra_modules()), log=str(log))
    )
    return {"PYTHONPATH": str(directory)}, log


def attempts(log: Path, pid: int | None = None) -> str:
    """Imports of the extra's modules attempted (by process ``pid``, or by any)."""
    files = [Path(f"{log}.{pid}")] if pid is not None else sorted(log.parent.glob(log.name + ".*"))
    return "".join(f.read_text() for f in files if f.exists())
