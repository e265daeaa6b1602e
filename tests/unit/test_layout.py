"""The layout rules of docs/architecture.md, checked on the source tree.

Imports are read with ``ast`` from every product module (function-local imports
included: a circle dodged by importing inside a function is still a circle;
imports under ``if TYPE_CHECKING:`` are left out, they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "publisher", "subscriber")
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path) -> set[str]:
    """The modules ``name`` imports (most specific module known for each name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for stmt in node.orelse:
                visit(stmt)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def test_no_module_imports_tests():
    """Nothing the product ships imports the test tree."""
    bad = sorted(f"{m} -> {i}" for m, deps in GRAPH.items() for i in deps if _top(i) == "tests")
    assert bad == []


def test_direction_of_imports():
    """common/ imports neither daemon; the daemons meet only through the wire contract."""
    allowed = {
        "common": {"common"},
        "publisher": {"common", "publisher"},
        "subscriber": {"common", "subscriber"},
    }
    bad = sorted(
        f"{m} -> {i}"
        for m, deps in GRAPH.items()
        for i in deps
        if _top(i) in PACKAGES and _top(i) not in allowed[_top(m)]
    )
    assert bad == []


def test_no_import_circle():
    """No circle among product modules, function-local imports included."""
    edges = {m: {d for d in deps if d in GRAPH and d != m} for m, deps in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    assert circles == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module):
    """Small modules: none over MAX_LINES lines (generated gRPC code excepted)."""
    path = MODULES[module]
    if "_pb2" in path.name:
        return
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines"


def test_test_modules_import_no_other_test_module():
    """Shared test code lives in tests/support/ (or tests/fixtures/), never in a test module."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.startswith("tests.") and module.rsplit(".", 1)[1][:5] == "test_":
                bad.append(f"{path.relative_to(ROOT)} -> {module}")
    assert bad == []
