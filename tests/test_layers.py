"""The package's layers hold: the import-linter contracts in pyproject.toml, no import cycles,
and no module imports another package's private (``_name``) module."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("heedful", exclude_type_checking_imports=True)


def test_import_contracts_are_kept():
    """``lint-imports`` with the project's contracts: the core imports no application, and
    every layer imports only the layers below it."""
    done = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def _cycles(graph) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.find_modules_directly_imported_by(node):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles(graph):
    """No group of modules imports itself round (function-level imports count; a package's
    ``__init__`` importing its own submodules does not make a cycle with them)."""
    for module in list(graph.modules):
        for imported in list(graph.find_modules_directly_imported_by(module)):
            if module == "heedful" or imported.startswith(module + "."):
                graph.remove_import(importer=module, imported=imported)
    assert _cycles(graph) == []


def test_no_private_module_is_imported_from_another_package(graph):
    offenders = []
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            parts = imported.split(".")
            private = [i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")]
            if private and not module.startswith(".".join(parts[: private[0]]) + "."):
                offenders.append(f"{module} -> {imported}")
    assert offenders == []


def test_every_module_has_its_layer():
    """Every top-level module and package of heedful -- and every module of a package that is
    not a layer as a whole (the engine, the files) -- sits in a layer of the import contract, so
    that the folders and the contract say the same thing."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    layered = {name.strip() for layer in layers for name in layer.split("|")}
    missing = []
    for path in sorted((ROOT / "heedful").iterdir()):
        package = (path / "__init__.py").is_file()
        if path.name.startswith(("_", ".")) or not (package or path.suffix == ".py"):
            continue
        name = f"heedful.{path.stem}"
        if package and name not in layered:
            missing += [f"{name}.{p.stem}" for p in sorted(path.glob("*.py")) if p.stem != "__init__" and f"{name}.{p.stem}" not in layered]
        elif name not in layered:
            missing.append(name)
    assert missing == [], f"{missing}: put each in the layer of pyproject.toml's layers contract where its imports place it"
