"""No import circle among fastvideo3's subpackages.

The graph is read from the source (the AST of every import statement, at module level and inside
functions alike: a deferred import is still a dependency). A node is a subpackage
(``fastvideo3/card``, ``fastvideo3/runtime``, ...) or a top-level module (``fastvideo3/errors.py``);
the root ``fastvideo3/__init__.py`` is the package's facade and registers the built-in model
families, so it stands above every node and is not one. Generated code (``fastvideo3/v1``) imports
nothing of ours.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "fastvideo3"


def node_of(module: str) -> str | None:
    """The graph node a dotted module name belongs to (None: not ours, or the root facade)."""
    parts = module.split(".")
    if parts[0] != "fastvideo3" or len(parts) == 1 or parts[1] == "v1":
        return None
    return parts[1]


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Import):
            out += [(a.name, n.lineno) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                base = ".".join(up + ([n.module] if n.module else []))
            out.append((base, n.lineno))
            out += [(f"{base}.{a.name}", n.lineno) for a in n.names]  # `from fastvideo3 import card`
    return out


def import_graph(pkg: Path = PKG) -> dict[str, dict[str, list[str]]]:
    """node -> node it imports -> the ``file:line`` of each import statement that makes the edge."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        src = node_of(module)
        if src is None:
            continue
        for target, line in _imports(path, module):
            dst = node_of(target)
            if dst is not None and dst != src and ((pkg / dst).is_dir() or (pkg / f"{dst}.py").exists()):
                if f"{rel}.py:{line}" not in graph[src][dst]:
                    graph[src][dst].append(f"{rel}.py:{line}")
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_among_subpackages():
    graph = import_graph()
    found = cycles(graph)
    lines = [f"{a} -> {b}: {', '.join(graph[a][b][:3])}" for comp in found for a in comp for b in graph[a] if b in comp]
    assert not found, f"import circles {found}:\n" + "\n".join(lines)


def test_the_check_finds_a_circle(tmp_path):
    pkg = tmp_path / "fastvideo3"
    for sub, body in {"card": "def f():\n    from fastvideo3.models.wan import x\n",
                      "models": "from fastvideo3.card.spec import ModelCard\n",
                      "loop": "from ..card import spec\n"}.items():
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text(body)
    graph = import_graph(pkg)
    assert graph["card"]["models"] and graph["loop"]["card"]  # a deferred import and a relative one both count
    assert cycles(graph) == [["card", "models"]]
