"""The import graph of iclmem's own packages, and what the layering rule forbids in it.

Layers, lowest first: ``iclmem`` (the core: records, errors, vocabularies, statistics), ``trainables`` (data,
models, fine-tuning), ``probes`` (scoring, metrics, verdicts), ``orchestrator`` (Ray, Tune, the command line,
reports). A module may import its own layer or a lower one, never a higher one; no two modules may import
each other, directly or through others (a circle); no module imports another's private (underscore) name.
Every import counts, the ones inside functions and under ``TYPE_CHECKING`` too: a lazy import is still a
dependency, only a later one.

    python tests/layering.py            # the problems, one a line (none: exit 0)
    python tests/layering.py --mermaid  # the graph between the layers, as docs/INTERFACES.md shows it
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

LAYERS = ("iclmem", "trainables", "probes", "orchestrator")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a package's __init__ is the package's name)
    name: str | None  # the name taken from it (``from target import name``), None for ``import target``
    line: int


def module_files(root: Path, packages: Sequence[str] = LAYERS) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(root: Path, packages: Sequence[str] = LAYERS) -> list[Import]:
    """Every import of one of ``packages`` by one of their modules, resolved to the module it loads."""
    modules = module_files(root, packages)
    found = []
    for source, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                pairs = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for target, name in pairs:
                if target.split(".")[0] not in packages:
                    continue
                if name is not None and f"{target}.{name}" in modules:  # ``from pkg import submodule``
                    target, name = f"{target}.{name}", None
                found.append(Import(source, target, name, node.lineno))
    return found


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def upward(found: Iterable[Import]) -> list[Import]:
    return [i for i in found if layer(i.target) > layer(i.source)]


def private(found: Iterable[Import]) -> list[Import]:
    """Private names taken from another module (``__all__`` and other dunders are not private)."""
    return [i for i in found if i.name and i.name.startswith("_") and not i.name.startswith("__")
            and i.target != i.source]


def circles(found: Iterable[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    edges: dict[str, set[str]] = defaultdict(set)
    for i in found:
        if i.target != i.source:
            edges[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(set(edges) | {t for ts in edges.values() for t in ts}):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return components


def problems(root: Path, packages: Sequence[str] = LAYERS) -> list[str]:
    """What breaks the layering rule under ``root``, one line each, naming the file and line."""
    modules = module_files(root, packages)
    found = imports(root, packages)

    def at(i: Import) -> str:
        return f"{modules[i.source].relative_to(root)}:{i.line}"

    lines = list(dict.fromkeys(f"{at(i)}: {i.source} imports {i.target} (layer {i.target.split('.')[0]} is above "
                               f"{i.source.split('.')[0]})" for i in upward(found)))
    lines += [f"{at(i)}: {i.source} imports the private name {i.name} of {i.target}" for i in private(found)]
    for component in circles(found):
        links = list(dict.fromkeys(f"{at(i)} ({i.source} -> {i.target})" for i in found
                                   if i.source in component and i.target in component and i.target != i.source))
        lines.append(f"circle of {len(component)} modules: {', '.join(component)}; its imports: {'; '.join(links)}")
    return lines


def mermaid(root: Path) -> str:
    """The graph between the layers, an arrow from the importing layer to each it imports, in the order of
    :data:`LAYERS` (docs/INTERFACES.md shows it; tests/test_layering.py keeps the two the same). The layers
    are acyclic by the rule; within a layer, circles are checked module by module (:func:`circles`)."""
    edges = sorted({(i.source.split(".")[0], i.target.split(".")[0]) for i in imports(root)},
                   key=lambda e: (LAYERS.index(e[0]), LAYERS.index(e[1])))
    return "\n".join(["graph BT", *(f"    {a} --> {b}" for a, b in edges if a != b)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--mermaid", action="store_true")
    args = parser.parse_args(argv)
    if args.mermaid:
        print(mermaid(Path(args.root)))
        return 0
    found = problems(Path(args.root))
    print("\n".join(found) or "no upward import, no circle, no private name across modules")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
