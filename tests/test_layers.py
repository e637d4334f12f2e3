"""The layering of src/phalanx, read from the source (no module is imported; `make lint` runs this file).

What counts as an import: every ``import phalanx...`` and ``from phalanx... import ...`` statement, with
``from phalanx.a import b`` also counting as an import of the module ``phalanx.a.b`` when that is a
module. Importing ``phalanx.a.b`` runs the ``__init__`` of the package ``phalanx.a`` too, so the packages
above an imported module count as imported as well, except those that already contain the importing
module (and the root package ``phalanx``, which every module is in). Imports of other packages
(torch, ray, jax, ...) are not checked: an optional extra imported inside a function is fine.

1. No import cycle among the modules, through the imports that run at import (module level, also inside
   a module-level ``if`` or ``try``; not in functions), nor when the imports under ``if TYPE_CHECKING:``
   count too (a dependency for a reader and a type checker).
2. Every import (module level, in functions, under TYPE_CHECKING) goes down or sideways in
   :data:`LAYERS`, never up.
3. No ``from phalanx.x.y import _private``: a name with a leading underscore stays in its module.
4. No module-level assignment to an attribute of an imported name (a class patched at import).
5. No module over :data:`MAX_LINES` lines: a module does one job (:data:`KNOWN_LONG`: the ones still to
   split, which may not grow).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SOURCE / "phalanx"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors and files", ("errors", "files", "compiling")),
    ("algorithm table", ("registry",)),
    ("config", ("config", "config.*")),
    ("market data", ("finance", "finance.*")),
    (
        "environments, worker pool, networks, buffers, optimisers",
        (
            "envs",
            "envs.*",
            "pool",
            "nets",
            "nets.*",
            "buffers",
            "buffers.*",
            "optim",
            "gradient_step",
            "marl.core",
            "marl.mpe",
            "marl.adapters",
            "marl.adapters.*",
            "marl.check",
            "marl.registry",
            "marl.buffers",
        ),
    ),
    ("algorithms", ("algos", "algos.*", "marl.base", "marl.mappo", "marl.qmix", "marl.maddpg")),
    ("runtime", ("train", "train.*", "marl.trainer")),
    (
        "applications",
        (
            "population",
            "population.*",
            "agent",
            "marl",
            "marl.agent",
            "backtesting",
            "video",
            "exporting",
            "tuning",
            "tuning.*",
        ),
    ),
    ("entry points", ("cli", "cli.*", "__main__", "")),
]
"""Bottom to top: module names relative to ``phalanx`` ("" is the root package, ``x.*`` every module
of the package x not named on its own). A module may import the modules of its own layer and below."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["phalanx", *parts])


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of ``module`` (a full name), or None if no layer names it."""
    relative = module.removeprefix("phalanx").removeprefix(".")
    for index, (_, names) in enumerate(LAYERS):
        if relative in names:
            return index
    for index, (_, names) in enumerate(LAYERS):
        if any(name.endswith(".*") and relative.startswith(name[:-1]) for name in names):
            return index
    return None


@dataclass(frozen=True)
class Import:
    importer: str
    line: int
    statement: str
    target: str
    """The module imported (for ``from a import b``: ``a.b`` if that is a module, else ``a``)."""
    names: tuple[str, ...]
    """The names a ``from`` import takes from ``target``'s package or module."""
    at_import: bool
    """Whether it runs when the importer is imported (module level, not under TYPE_CHECKING)."""
    module_level: bool
    """Whether it is at module level (under TYPE_CHECKING too): a dependency of the module as a whole."""


def _absolute(node: ast.ImportFrom, importer: str) -> str:
    if not node.level:
        return node.module or ""
    package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(body: list[ast.stmt], at_import: bool, module_level: bool = True):
    """Every statement of ``body`` and the blocks inside it, with whether it runs at import and whether it
    is at module level (not in a function; under TYPE_CHECKING counts)."""
    for node in body:
        yield node, at_import, module_level
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _walk(node.body, False, False)
        elif isinstance(node, ast.ClassDef):
            yield from _walk(node.body, at_import, module_level)
        elif isinstance(node, ast.If):
            runs = at_import and not _is_type_checking(node)
            yield from _walk(node.body, runs, module_level)
            yield from _walk(node.orelse, at_import, module_level)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(node, field, None)
                if isinstance(block, list) and block and isinstance(block[0], (ast.stmt, ast.excepthandler)):
                    yield from _walk(block, at_import, module_level)


def imports_of(importer: str) -> list[Import]:
    path = MODULES[importer]
    source = path.read_text()
    found = []
    for node, at_import, module_level in _walk(ast.parse(source).body, True):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        statement = ast.get_source_segment(source, node) or ""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "phalanx" or alias.name.startswith("phalanx."):
                    found.append(
                        Import(importer, node.lineno, statement, alias.name, (), at_import, module_level)
                    )
            continue
        base = _absolute(node, importer)
        if base != "phalanx" and not base.startswith("phalanx."):
            continue
        names = tuple(alias.name for alias in node.names)
        submodules = [f"{base}.{name}" for name in names if f"{base}.{name}" in MODULES]
        found.append(Import(importer, node.lineno, statement, base, names, at_import, module_level))
        found += [
            Import(importer, node.lineno, statement, sub, (), at_import, module_level) for sub in submodules
        ]
    return found


def with_packages(item: Import) -> list[str]:
    """``item.target`` and the packages above it that importing it runs, outside the importer's own."""
    parts = item.target.split(".")
    targets = [".".join(parts[:end]) for end in range(2, len(parts) + 1)]
    own = {item.importer.rsplit(".", depth)[0] for depth in range(item.importer.count("."))} | {item.importer}
    return [target for target in targets if target == item.target or target not in own]


def where(item: Import) -> str:
    first, _, rest = item.statement.partition("\n")
    return (
        f"{MODULES[item.importer].relative_to(SOURCE.parent)}:{item.line}: `{first}{' ...' if rest else ''}`"
    )


ALL_IMPORTS = [item for module in MODULES for item in imports_of(module)]


def test_every_module_has_a_layer():
    missing = [module for module in MODULES if layer_of(module) is None]
    assert not missing, (
        f"modules without a layer: {missing}. Add each to LAYERS in tests/test_layers.py, in the layer of "
        "what it does (it may import its own layer and those below)."
    )


def module_graph(at_import: bool) -> tuple[dict[str, set[str]], dict[tuple[str, str], Import]]:
    """The modules' imports as a graph: those that run at import (``at_import``), or every module-level one
    (TYPE_CHECKING included); with the statement of each edge."""
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    lines: dict[tuple[str, str], Import] = {}
    for item in ALL_IMPORTS:
        if item.at_import if at_import else item.module_level:
            for target in with_packages(item):
                if target in MODULES and target != item.importer:
                    graph[item.importer].add(target)
                    lines.setdefault((item.importer, target), item)
    return graph, lines


@pytest.mark.parametrize("at_import", [True, False], ids=["at-import", "type-checking-too"])
def test_no_import_cycle(at_import):
    graph, lines = module_graph(at_import)
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                cycles.append(
                    " -> ".join(cycle)
                    + "".join(f"\n    {where(lines[step])}" for step in zip(cycle, cycle[1:], strict=False))
                )
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, (
        "import cycles (rule: no cycle among the module-level imports, TYPE_CHECKING ones included; move "
        "the shared code into the lower module, type against a Protocol in it, or import downward only):\n"
        + "\n".join(cycles)
    )


def test_imports_only_go_down_the_layers():
    upward = []
    for item in ALL_IMPORTS:
        own = layer_of(item.importer)
        for target in with_packages(item):
            theirs = layer_of(target)
            if own is not None and theirs is not None and theirs > own:
                upward.append(
                    f"{where(item)} imports {target} (layer {theirs}, {LAYERS[theirs][0]}) from "
                    f"{item.importer} (layer {own}, {LAYERS[own][0]})"
                )
    assert not upward, (
        "imports going up the layers (rule: a module imports only its own layer and those below, "
        "LAYERS in tests/test_layers.py; move the code it needs down, or the importer up):\n"
        + "\n".join(upward)
    )


def test_no_private_names_imported():
    crossing = []
    for item in ALL_IMPORTS:
        private = [name for name in item.names if name.startswith("_") and not name.startswith("__")]
        if private and item.target in MODULES:
            crossing.append(f"{where(item)} takes {private} from {item.target}")
    assert not crossing, (
        "private names imported from another module (rule: a name with a leading underscore stays in its "
        "module; make it public where it is shared, or move it):\n" + "\n".join(crossing)
    )


MAX_LINES = 600
KNOWN_LONG: dict[str, int] = {}
"""Issue 37, still open: modules over the limit, each with the most lines it may have until it is split.
A module leaves this table when it is split; the table only shrinks (a stale entry fails)."""


def test_no_module_over_the_line_limit():
    lines = {
        str(path.relative_to(SOURCE.parent)): len(path.read_text().splitlines()) for path in MODULES.values()
    }
    long = {path: count for path, count in lines.items() if count > KNOWN_LONG.get(path, MAX_LINES)}
    stale = sorted(path for path, bound in KNOWN_LONG.items() if lines.get(path, 0) <= MAX_LINES)
    assert not long, (
        f"modules over {MAX_LINES} lines, or over their bound in KNOWN_LONG (rule: a module does one job; "
        f"split it by job into a package or sibling modules): {long}"
    )
    assert not stale, (
        f"remove these from KNOWN_LONG in tests/test_layers.py, they are within the limit: {stale}"
    )


def test_no_class_patched_at_import():
    patched = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        imported = {
            (alias.asname or alias.name).partition(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        for node, at_import, _ in _walk(tree.body, True):
            targets = {ast.Assign: "targets", ast.AugAssign: "target", ast.AnnAssign: "target"}
            if not at_import or type(node) not in targets:
                continue
            value = getattr(node, targets[type(node)])
            for target in value if isinstance(value, list) else [value]:
                root = target
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if target is not root and isinstance(root, ast.Name) and root.id in imported:
                    patched.append(
                        f"{path.relative_to(SOURCE.parent)}:{node.lineno}: `{ast.unparse(node)}` sets an "
                        f"attribute of the imported {root.id!r} in {module}"
                    )
    assert not patched, (
        "attributes of imported names set at import (rule: no class or module patched at import time; "
        "say it where the class is defined, or look it up in a table such as phalanx.registry):\n"
        + "\n".join(patched)
    )


LOADED = "import sys, {package}; print(*sorted(name for name in sys.modules if name.startswith('phalanx')))"


@pytest.mark.parametrize("package", ["phalanx.envs", "phalanx.config", "phalanx.registry"])
def test_importing_a_lower_layer_does_not_import_the_learners(package):
    """A fresh interpreter: what importing ``package`` brings in stays below the algorithms. (The root
    package ``phalanx`` names its exports lazily, and loads the empty package ``phalanx.train`` so that
    ``phalanx.train`` stays the training function.)"""
    path = os.pathsep.join([str(SOURCE), os.environ.get("PYTHONPATH", "")])
    loaded = subprocess.run(
        [sys.executable, "-c", LOADED.format(package=package)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    ).stdout.split()
    algorithms = [name for name, _ in LAYERS].index("algorithms")
    above = [
        module
        for module in loaded
        if module not in ("phalanx", "phalanx.train") and layer_of(module) >= algorithms
    ]
    assert not above, f"importing {package} imports {above}, which are learners or above"
