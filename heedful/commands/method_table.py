"""``heedful methods --markdown --write README.md``: the README's method table rewritten from the
registry, in place between its markers (:func:`heedful.render.methods.splice_method_table`).

Registered in :mod:`heedful.cli`.
"""

from __future__ import annotations

from pathlib import Path

from heedful.commands.console import err
from heedful.errors import InputError
from heedful.files.atomic import atomic_file
from heedful.render.methods import END, MARKERS, splice_method_table


def write_method_table(path: Path, table: str) -> bool:
    """Splice ``table`` into the markdown file ``path`` between its method-table markers (written
    atomically, and only when it changed); whether it changed. An :class:`InputError` when the
    file is missing or holds no markers."""
    if not path.is_file():
        raise InputError(f"{path} is not a file", hint="give the README that holds the method table: --write README.md")
    text = path.read_text(encoding="utf-8")
    try:
        spliced = splice_method_table(text, table)
    except ValueError:
        raise InputError(f"{path} has no method table to replace", hint=f"put the two lines {MARKERS} and {END} where the table goes") from None
    changed = spliced != text
    if changed:
        with atomic_file(path) as part:
            part.write_text(spliced, encoding="utf-8")
    rows = len(table.splitlines()) - 2
    err.print(f"{path}: method table {'rewritten' if changed else 'already up to date'} ({rows} methods)")
    return changed
