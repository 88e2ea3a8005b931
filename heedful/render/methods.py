"""The method table as markdown: what ``heedful methods --markdown`` prints and the README holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

HEADER = "| method | family | cost per example | what it computes | source |\n|---|---|---|---|---|"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def method_table(infos: Iterable[Any]) -> str:
    """One markdown row per method (name, family, cost, summary, citation) under a header.

    >>> from types import SimpleNamespace
    >>> print(method_table([SimpleNamespace(name="saliency", family="gradient", cost="1 forward",
    ...     summary="Gradient norm.", citation="Simonyan et al. 2014")]))
    | method | family | cost per example | what it computes | source |
    |---|---|---|---|---|
    | `saliency` | gradient | 1 forward | Gradient norm. | Simonyan et al. 2014 |
    """
    rows = [
        f"| `{i.name}` | {i.family} | {_cell(i.cost)} | {_cell(i.summary)} | {_cell(i.citation)} |" for i in infos
    ]
    return "\n".join([HEADER, *rows])
