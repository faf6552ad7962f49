"""The import graph of iclmem's own packages, and what the layering rule forbids in it.

Layers, lowest first: ``iclmem`` (the core: records, errors, vocabularies, statistics), ``trainables`` (data,
models, fine-tuning), ``probes`` (scoring, metrics, verdicts), ``orchestrator`` (Ray, Tune, the command line,
reports). A module may import its own layer or a lower one, never a higher one; no two modules may import
each other, directly or through others (a circle); no module takes another's private (underscore) name, by
import or as an attribute of a module it imported (``scoring._chunk``). Every import counts: the ones inside
functions and under ``TYPE_CHECKING``, relative ones (``from . import x``) and ``importlib.import_module`` of a
literal name; a lazy import is still a dependency, only a later one. An ``import_module`` of a computed name is
allowed only in :data:`DYNAMIC_IMPORTERS` (they load the user's or an optional package's module, never ours).

The orchestrator's folders are layers too (:data:`ORCHESTRATOR_FOLDERS`, lowest first): a folder imports its
own modules and the folders below it, never a sibling or one above, so the folder graph has no loop.

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
# the orchestrator's folders (and its command-line module), lowest first; a tuple is folders of one rank, which
# may not import each other
ORCHESTRATOR_FOLDERS: tuple[tuple[str, ...], ...] = (
    ("orchestrator.schema",), ("orchestrator.runfolder",), ("orchestrator.report",),
    ("orchestrator.audits", "orchestrator.estimate", "orchestrator.cluster"), ("orchestrator.driver",),
    ("orchestrator.commands",), ("orchestrator.cli",))
# modules that import a module named at run time (the user's estimator factory, an optional package's adapter)
DYNAMIC_IMPORTERS = frozenset({"trainables.models.estimator", "trainables.models.extras"})


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


def _absolute(source: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from`` import names, a relative one resolved against the importing module's package."""
    if node.level == 0:
        return node.module or ""
    package = source.split(".") if path.name == "__init__.py" else source.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _literal_import_module(node: ast.AST) -> tuple[bool, str | None] | None:
    """For an ``importlib.import_module(...)`` / ``import_module(...)`` call: (True, the name) when it is a
    literal string, (False, None) when computed; None for any other node."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called != "import_module" or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
        return True, first.value
    return False, None


def imports(root: Path, packages: Sequence[str] = LAYERS) -> list[Import]:
    """Every import of one of ``packages`` by one of their modules, resolved to the module it loads."""
    return _scan(root, packages)[0]


def _scan(root: Path, packages: Sequence[str]) -> tuple[list[Import], list[str]]:
    """(the imports, the problems found on the way: computed ``import_module`` names outside
    :data:`DYNAMIC_IMPORTERS`, and private names read as an attribute of another of the packages' modules)."""
    modules = module_files(root, packages)
    found: list[Import] = []
    other: list[str] = []
    for source, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # a local name bound to one of the packages' modules -> that module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, None) for alias in node.names]
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                target_module = _absolute(source, path, node)
                if not target_module:
                    continue
                pairs = [(target_module, alias.name) for alias in node.names]
                for alias in node.names:
                    if f"{target_module}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{target_module}.{alias.name}"
            else:
                call = _literal_import_module(node)
                if call is None:
                    continue
                literal, name = call
                if not literal:
                    if source not in DYNAMIC_IMPORTERS:
                        other.append(f"{path.relative_to(root)}:{node.lineno}: {source} imports a module named at run "
                                     "time (importlib.import_module): the layering check cannot follow it")
                    continue
                pairs = [(name, None)]
            for target, name in pairs:
                if target.split(".")[0] not in packages:
                    continue
                if name is not None and f"{target}.{name}" in modules:  # ``from pkg import submodule``
                    target, name = f"{target}.{name}", None
                found.append(Import(source, target, name, node.lineno))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and bound.get(node.value.id, source) != source):
                other.append(f"{path.relative_to(root)}:{node.lineno}: {source} reads the private name {node.attr} "
                             f"of {bound[node.value.id]}")
    return found, other


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


def folder(module: str) -> str | None:
    """The orchestrator folder (or the command-line module) ``module`` belongs to; None outside them."""
    for rank in ORCHESTRATOR_FOLDERS:
        for name in rank:
            if module == name or module.startswith(name + "."):
                return name
    return None


def _folder_rank(name: str) -> int:
    return next(r for r, rank in enumerate(ORCHESTRATOR_FOLDERS) if name in rank)


def across_folders(found: Iterable[Import]) -> list[Import]:
    """Imports from one orchestrator folder into a sibling of the same rank or a folder above it."""
    bad = []
    for i in found:
        a, b = folder(i.source), folder(i.target)
        if a and b and a != b and _folder_rank(b) >= _folder_rank(a):
            bad.append(i)
    return bad


def folder_circles(found: Iterable[Import]) -> list[list[str]]:
    """Loops in the graph between the orchestrator's folders (each a node)."""
    links = [Import(folder(i.source) or "", folder(i.target) or "", None, i.line) for i in found
             if folder(i.source) and folder(i.target) and folder(i.source) != folder(i.target)]
    return circles(links)


def problems(root: Path, packages: Sequence[str] = LAYERS) -> list[str]:
    """What breaks the layering rule under ``root``, one line each, naming the file and line."""
    modules = module_files(root, packages)
    found, other = _scan(root, packages)

    def at(i: Import) -> str:
        return f"{modules[i.source].relative_to(root)}:{i.line}"

    lines = list(dict.fromkeys(f"{at(i)}: {i.source} imports {i.target} (layer {i.target.split('.')[0]} is above "
                               f"{i.source.split('.')[0]})" for i in upward(found)))
    lines += [f"{at(i)}: {i.source} imports the private name {i.name} of {i.target}" for i in private(found)]
    for component in circles(found):
        links = list(dict.fromkeys(f"{at(i)} ({i.source} -> {i.target})" for i in found
                                   if i.source in component and i.target in component and i.target != i.source))
        lines.append(f"circle of {len(component)} modules: {', '.join(component)}; its imports: {'; '.join(links)}")
    lines += [f"{at(i)}: {i.source} imports {i.target}: folder {folder(i.target)} is not below {folder(i.source)} "
              f"(tests/layering.py ORCHESTRATOR_FOLDERS)" for i in across_folders(found)]
    lines += [f"loop between the orchestrator's folders: {', '.join(c)}" for c in folder_circles(found)]
    return lines + other


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
    print("\n".join(found) or "no upward import, no circle, no private name across modules, no folder loop")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
