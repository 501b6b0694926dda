#!/usr/bin/env python
"""The package's import graph: cycles, and the longest classes.

    python scripts/import_graph.py            # exit 1 when easd_local/ has an import cycle

Every import counts: module level, inside functions and under ``if TYPE_CHECKING`` (a cycle
through a type-only import is still two modules that each need the other to be read).
``from . import x`` counts as importing the submodule ``x`` when it is one, else the package.
Nothing is imported or run: the files are parsed with ``ast``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "easd_local"


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, current: str, is_pkg: bool, level: int) -> str:
    if level == 0:
        return name
    base = current.split(".") if is_pkg else current.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports (anywhere in the file)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def add(target: str) -> None:
        # the longest known prefix: "easd_local.engine.rules.X" -> "easd_local.engine.rules"
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", name, is_pkg, node.level)
            for a in node.names:
                sub = f"{base}.{a.name}" if base else a.name
                add(sub if sub in known else base)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {m: imports_of(m, p, known) for m, p in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def longest_classes(root: Path = ROOT, top: int = 5) -> list[tuple[int, str]]:
    """(lines, "module.Class") of the longest classes, longest first."""
    sizes = []
    for name, path in modules(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                sizes.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
    return sorted(sizes, reverse=True)[:top]


def main() -> int:
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    g = graph()
    found = cycles(g)
    print(f"{len(g)} modules, {sum(len(v) for v in g.values())} imports inside {PACKAGE}/")
    for comp in found:
        print("cycle: " + " <-> ".join(comp))
    print("longest classes: " + ", ".join(f"{n} ({lines} lines)" for lines, n in longest_classes()))
    if not found:
        print("no import cycle")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
