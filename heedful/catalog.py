"""The catalog of the built-in methods: the registry's table (name, family, tasks, cost, source,
summary, options) stored as JSON beside the package, so that ``heedful methods`` and
``heedful --help`` answer without importing torch (which alone takes seconds to import).

The registry stays the one place a method is declared (:func:`heedful.registry.register`):
``heedful/methods.json`` is generated from it (``python -m heedful.catalog``), and
``tests/test_startup.py`` fails while the two differ (a method added, renamed or re-described
without regenerating the catalog). Where the file is missing or unreadable, :func:`entries`
reads the live registry instead -- slower, never wrong. Only the tables read the catalog:
explaining, ``heedful methods NAME`` of a name not in it, and :func:`heedful.methods` use the
registry itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
CATALOG = PACKAGE / "methods.json"
"""Where the generated catalog lives (package data)."""


@dataclass(frozen=True)
class OptionEntry:
    """One option of a method as the tables show it: its default (``repr``), what it accepts
    (:meth:`~heedful.engine.options.OptionSpec.describe`) and whether it only decides chunking."""

    name: str
    default: str
    accepts: str
    runtime: bool


@dataclass(frozen=True)
class MethodEntry:
    """A built-in method's row of the catalog (the fields of :class:`~heedful.MethodInfo` that
    the tables show)."""

    name: str
    family: str
    tasks: tuple[str, ...]
    cost: str
    citation: str
    summary: str
    options: tuple[OptionEntry, ...]


@dataclass(frozen=True)
class Catalog:
    """Every built-in method, in :func:`heedful.methods` order, and the tasks models can have."""

    methods: tuple[MethodEntry, ...]
    tasks: tuple[str, ...]

    def find(self, name: str) -> MethodEntry:
        """The method called ``name`` (any spelling :func:`heedful.get_method` accepts); an
        unknown name raises the registry's own error, with its hints."""
        for entry in self.methods:
            if entry.name in (name, name.replace("-", "_").lower()):
                return entry
        from heedful.attribution import get_method  # the registry's error, e.g. "did you mean"

        return entry_of(get_method(name))


def entry_of(info: Any) -> MethodEntry:
    """The catalog row of a registered method (:class:`~heedful.MethodInfo`)."""
    options = tuple(OptionEntry(s.name, repr(s.default), s.describe(), s.runtime) for s in info.options)
    return MethodEntry(info.name, info.family, tuple(info.tasks), info.cost, info.citation, info.summary, options)


def from_registry() -> Catalog:
    """The catalog read off the live registry (imports every method module, and torch)."""
    from heedful.attribution import methods
    from heedful.engine.targets import TASKS

    return Catalog(tuple(entry_of(info) for info in methods()), TASKS)


def as_json(catalog: Catalog) -> str:
    """The text of ``methods.json`` for ``catalog``."""
    data = {
        "tasks": list(catalog.tasks),
        "methods": [
            {
                "name": m.name, "family": m.family, "tasks": list(m.tasks), "cost": m.cost,
                "citation": m.citation, "summary": m.summary,
                "options": [vars(o) for o in m.options],
            }
            for m in catalog.methods
        ],
    }
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def _read(text: str) -> Catalog:
    data = json.loads(text)
    methods = tuple(
        MethodEntry(
            m["name"], m["family"], tuple(m["tasks"]), m["cost"], m["citation"], m["summary"],
            tuple(OptionEntry(**o) for o in m["options"]),
        )
        for m in data["methods"]
    )
    return Catalog(methods, tuple(data["tasks"]))


def entries() -> Catalog:
    """The built-in methods: from ``methods.json`` (milliseconds), or where it is missing or
    unreadable from the registry (seconds: torch is imported)."""
    try:
        return _read(CATALOG.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return from_registry()


def write(path: Path = CATALOG) -> Path:
    """Regenerate the catalog from the registry (``python -m heedful.catalog``)."""
    path.write_text(as_json(from_registry()), encoding="utf-8")
    return path


if __name__ == "__main__":  # pragma: no cover
    print(f"wrote {write()}")
