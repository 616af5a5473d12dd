"""The package's shape, held: no import circles, modules a newcomer can read in one sitting.

Imports are read with ``ast`` from the source (nothing is imported), at module
level and inside functions alike, ``if TYPE_CHECKING:`` blocks included: a
circle that only a type checker follows still means two modules that cannot be
read apart. docs/architecture.md draws the layers these tests keep.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Most lines any module of the package may have (docs/architecture.md says why).
MAX_MODULE_LINES = 700


def _modules(package: str) -> dict[str, Path]:
    """Every module of ``package`` (a top-level folder of the repository) by dotted name."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path], package: str) -> set[str]:
    """The modules of ``package`` that module ``name`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from pkg import mod` imports the submodule; `from mod import name` the module.
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules
                       else origin for alias in node.names]
        else:
            continue
        for target in targets:
            # `import a.b.c` runs a, a.b and a.b.c: the deepest one we know is the edge.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.split(".")[0] == package and target != name:
                out.add(target)
    return out


def import_circles(package: str) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    modules = _modules(package)
    edges = {m: _imported(m, p, modules, package) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return circles


def _describe(circles: list[list[str]]) -> str:
    return "; ".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("package", ["host_kernel", "benchmarks"])
def test_no_module_imports_itself_back_through_others(package: str) -> None:
    circles = import_circles(package)
    assert not circles, f"import circles in {package}/: {_describe(circles)}"


def test_the_circle_finder_finds_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """A positive control: two modules that import each other, one of them only inside a
    function and one only for type checking, are reported."""
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from circ.a import f\n")
    (pkg / "c.py").write_text("from . import a\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert import_circles("circ") == [["circ.a", "circ.b"]]


def test_every_module_of_the_package_reads_in_one_sitting() -> None:
    long = {name: n for name, path in _modules("host_kernel").items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_the_host_is_a_thin_facade() -> None:
    path = ROOT / "host_kernel" / "host" / "_host.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert len(path.read_text(encoding="utf-8").splitlines()) < 600
    init = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                and node.name == "__init__")
    assert init.end_lineno is not None and init.end_lineno - init.lineno + 1 < 60


FRONTS = {"agent", "cli", "_cli", "batch", "control", "mcp_server", "viewer", "__main__"}

#: What each layer must never import directly (docs/architecture.md, the layer table).
NEVER: dict[str, set[str]] = {
    "host": FRONTS,
    "verify": FRONTS | {"host"},
    "reproduce": FRONTS | {"host", "verify"},
    "lineage": FRONTS | {"host", "verify"},
    "kernel": FRONTS | {"host", "store"},
    "viewer": {"host"},
    "_values": {"_display", "_models"},
    "_displayed": {"_display", "_models", "_values"},
}
#: The lowest layers, by what they may import at all.
ONLY: dict[str, set[str]] = {
    "store": {"_errors", "_paths", "_procs"},
    "sandbox": {"_paths", "_fds"},
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_each_layer_imports_only_what_lies_below_it() -> None:
    modules = _modules("host_kernel")
    broken = []
    for name, path in modules.items():
        layer = _layer(name)
        for target in _imported(name, path, modules, "host_kernel"):
            other = _layer(target)
            if other == layer or target == "host_kernel":
                continue
            if other in NEVER.get(layer, set()) or (
                    layer in ONLY and other not in ONLY[layer]):
                broken.append(f"{name} imports {target}")
    assert not broken, "layering broken: " + "; ".join(sorted(broken))
