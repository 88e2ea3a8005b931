"""Showing explanations to a person: terminal heatmaps, HTML pages, plots.

The names below are imported on first use (PEP 562), so that the progress bars of
:mod:`heedful.render.progress` cost no numpy at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heedful.render.html import explanation_page
    from heedful.render.terminal import print_explanations

_LAZY = {"explanation_page": "heedful.render.html", "print_explanations": "heedful.render.terminal"}


_SUBMODULES = frozenset({"colors", "generation", "html", "layout", "methods", "progress", "sources", "terminal"})


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:  # heedful.render.progress.show_progress after a bare import heedful
        return importlib.import_module(f"heedful.render.{name}")
    raise AttributeError(f"module 'heedful.render' has no attribute {name!r}")


__all__ = ["explanation_page", "print_explanations"]
