"""The import graph of attngen/ has no circle.

An import inside a function still ties two modules: it only moves the failure from import time to
call time, so the walk reads every import statement wherever it sits."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "attngen"

# Circles left in attngen/: none since #58; keep it so.
CIRCLES_NOW = 0


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py")) if "__pycache__" not in p.parts}


def resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names, relative levels counted from the importer's package."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """attngen modules one module imports, at module level or inside functions. `from X import y`
    is an edge to X.y when that is a module, else to X."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            target = resolve(name, is_package, node)
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components, walked with an explicit stack: the graph is deeper than is safe to recurse."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    return sorted(c for c in strongly_connected(graph) if len(c) > 1)


def test_no_import_circle():
    found = circles(import_graph())
    described = "\n".join(f"  {len(c)} modules: {' <-> '.join(c)}" for c in found)
    assert len(found) == CIRCLES_NOW == 0, f"{len(found)} import circles:\n{described}"


def test_the_walk_sees_function_level_and_relative_imports():
    """The check above cannot pass by seeing nothing."""
    graph = import_graph()
    assert "attngen.core.forward_plan" in graph["attngen.kinds.fwd_mma"]
    assert "attngen.kinds.fwd_mma" in graph["attngen.kinds"]     # `from . import` inside a function


def test_tarjan_finds_circles_and_leaves_chains():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"f"}}
    assert circles(graph) == [["a", "b", "c"]]
    chain = {str(i): {str(i + 1)} for i in range(5000)} | {"5000": set()}
    assert circles(chain) == []
