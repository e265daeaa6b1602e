"""One error tree: every exception txrepl defines roots at common.errors.TxreplError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import common.errors

PACKAGES = ("common", "publisher", "subscriber")


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        names = [pkg_name] + [
            m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg_name}.")
        ]
        for name in names:
            # Private modules may keep control-flow signals that never leave their
            # package (e.g. the fast entry walk's ``Unrecognised``).
            if "_pb2" in name or name.rsplit(".", 1)[-1].startswith("_"):
                continue
            module = importlib.import_module(name)
            for attr, obj in vars(module).items():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                    and not attr.startswith("_")
                ):
                    found[f"{name}.{attr}"] = obj
    return found


def test_every_error_roots_at_txrepl_error():
    """An operator (or a caller) can catch txrepl's own failures with one class."""
    classes = _exception_classes()
    assert "common.errors.TxreplError" in classes
    strays = sorted(n for n, c in classes.items() if not issubclass(c, common.errors.TxreplError))
    assert strays == []


def test_one_transient_error():
    """Every error named Transient... is a common.errors.TransientError (one retry rule)."""
    classes = _exception_classes()
    bad = sorted(
        n
        for n, c in classes.items()
        if "Transient" in n.rsplit(".", 1)[1] and not issubclass(c, common.errors.TransientError)
    )
    assert bad == []
