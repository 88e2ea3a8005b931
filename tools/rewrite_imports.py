"""Rewrite references to moved heedful modules in the given files (or folders), in place.

The moves are read from ``tools/module_moves.txt`` (one ``heedful.old heedful.new`` pair a line:
a module, or a name moved from one module to another).
Three forms are rewritten:

- dotted names anywhere (imports, ``import heedful.x as y``, strings such as
  ``monkeypatch.setattr("heedful.x.name", ...)``, docstrings): ``heedful.old`` -> ``heedful.new``;
- ``from heedful import old`` -> ``from heedful.<package> import old``, and a name moved between
  modules (a ``heedful.module.Name heedful.other.Name`` line) imported from its new module (an
  import of moved and unmoved names is split into one line per module; sort the imports after,
  e.g. ``ruff check --select I --fix``);
- source paths in prose: ``heedful/old.py`` -> ``heedful/<package>/old.py``.

    python tools/rewrite_imports.py heedful tests benchmarks docs README.md

Prints each file it changed; ``--check`` only lists the files that would change (exit 1 if any).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MOVES_FILE = Path(__file__).with_name("module_moves.txt")
SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".rst"}


def read_moves(path: Path = MOVES_FILE) -> dict[str, str]:
    """``{"heedful.old": "heedful.new"}`` from the moves file (blank lines and ``#`` comments skipped)."""
    moves = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            old, new = line.split()
            moves[old] = new
    return moves


def _from_import(moves: dict[str, str], match: re.Match) -> str:
    """``from heedful.x import a, b`` with each moved name (a module, or a name moved between
    modules) imported from its new place, one line per place."""
    indent, module = match.group(1), match.group(2)
    names = [n.strip() for n in (match.group(3) or match.group(4)).replace("\n", " ").split(",") if n.strip()]
    groups: dict[str, list[str]] = {}
    for name in names:
        new = moves.get(f"{module}.{name.split(' as ')[0].strip()}")
        groups.setdefault(new.rsplit(".", 1)[0] if new else module, []).append(name)
    if set(groups) == {module}:
        return match.group(0)
    comment = f"  {match.group(5)}" if match.group(5) else ""
    lines = [f"{indent}from {place} import {', '.join(found)}" for place, found in groups.items()]
    return "\n".join(lines) + comment


def rewrite(text: str, moves: dict[str, str]) -> str:
    """``text`` with every reference to a moved module pointing to its new place."""
    olds = "|".join(re.escape(old.split(".", 1)[1]) for old in sorted(moves, key=len, reverse=True))
    text = re.sub(
        r"^([ \t]*)from (heedful[\w.]*) import (?:\(([\w\s,]+)\)|([\w ,]+?))[ \t]*(#.*)?$",
        lambda m: _from_import(moves, m),
        text,
        flags=re.MULTILINE,
    )
    text = re.sub(
        rf"(?<![\w./])heedful\.({olds})(?![\w-])",
        lambda m: moves[f"heedful.{m.group(1)}"],
        text,
    )
    return re.sub(
        rf"(?<![\w./])heedful/({olds})\.py\b",
        lambda m: moves[f"heedful.{m.group(1)}"].replace(".", "/") + ".py",
        text,
    )


def _files(paths: list[str]) -> list[Path]:
    found = []
    for given in map(Path, paths):
        if given.is_dir():
            found += sorted(p for p in given.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        else:
            found.append(given)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="files or folders to rewrite")
    parser.add_argument("--moves", type=Path, default=MOVES_FILE, help="the moves file")
    parser.add_argument("--check", action="store_true", help="list the files that would change, change none")
    args = parser.parse_args(argv)
    moves = read_moves(args.moves)
    changed = []
    for path in _files(args.paths):
        text = path.read_text()
        new = rewrite(text, moves)
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new)
            print(path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
