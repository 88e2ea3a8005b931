"""The catalog of the built-in methods: the registry's table (name, family, tasks, cost, source,
summary, options) stored as JSON beside the package, so that ``heedful methods`` and
``heedful --help`` answer without importing torch (which alone takes seconds to import).

The registry stays the one place a method is declared (:func:`heedful.registry.register`):
``heedful/methods.json`` is generated from it (``python -m heedful.catalog``) and carries a
fingerprint of the source files that declare the methods. Where the fingerprint does not match
the files installed (a method edited, the catalog not regenerated), :func:`entries` reads the
live registry instead -- slower, never wrong -- and ``tests/test_catalog.py`` fails until the
catalog is regenerated.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
CATALOG = PACKAGE / "methods.json"
"""Where the generated catalog lives (package data)."""


def _sources() -> list[Path]:
    """The files whose text decides the built-in methods' metadata: every method module, the
    registry, the option reader and the tasks."""
    return sorted((PACKAGE / "attribution").glob("*.py")) + [
        PACKAGE / name for name in ("registry.py", "options.py", "targets.py")
    ]


def fingerprint() -> str:
    """sha256 over the declaring files' texts (line endings normalised, paths relative)."""
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.relative_to(PACKAGE).as_posix().encode())
        digest.update(path.read_bytes().replace(b"\r\n", b"\n"))
    return digest.hexdigest()


@dataclass(frozen=True)
class OptionEntry:
    """One option of a method as the tables show it: its default (``repr``), what it accepts
    (:meth:`~heedful.options.OptionSpec.describe`) and whether it only decides chunking."""

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

        return _entry(get_method(name))


def _entry(info: Any) -> MethodEntry:
    options = tuple(OptionEntry(s.name, repr(s.default), s.describe(), s.runtime) for s in info.options)
    return MethodEntry(info.name, info.family, tuple(info.tasks), info.cost, info.citation, info.summary, options)


def from_registry() -> Catalog:
    """The catalog read off the live registry (imports every method module, and torch)."""
    from heedful.attribution import methods
    from heedful.targets import TASKS

    return Catalog(tuple(_entry(info) for info in methods()), TASKS)


def as_json(catalog: Catalog) -> str:
    """The text of ``methods.json`` for ``catalog``, with the current :func:`fingerprint`."""
    data = {
        "fingerprint": fingerprint(),
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


def _read(text: str) -> Catalog | None:
    data = json.loads(text)
    if data.get("fingerprint") != fingerprint():
        return None
    methods = tuple(
        MethodEntry(
            m["name"], m["family"], tuple(m["tasks"]), m["cost"], m["citation"], m["summary"],
            tuple(OptionEntry(**o) for o in m["options"]),
        )
        for m in data["methods"]
    )
    return Catalog(methods, tuple(data["tasks"]))


def entries() -> Catalog:
    """The built-in methods: from ``methods.json`` when it matches the installed method
    modules (milliseconds), else from the registry (seconds: torch is imported)."""
    try:
        found = _read(CATALOG.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        found = None
    return found if found is not None else from_registry()


def write(path: Path = CATALOG) -> Path:
    """Regenerate the catalog from the registry (``python -m heedful.catalog``)."""
    path.write_text(as_json(from_registry()), encoding="utf-8")
    return path


if __name__ == "__main__":  # pragma: no cover
    print(f"wrote {write()}")
