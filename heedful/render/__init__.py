"""Showing explanations to a person: terminal heatmaps, HTML pages, plots.

The names below are imported on first use (PEP 562), so that the progress bars of
:mod:`heedful.render.progress` cost no numpy at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heedful.render.html import explanation_page
    from heedful.render.terminal import print_explanations

_LAZY = {"explanation_page": "heedful.render.html", "print_explanations": "heedful.render.terminal"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'heedful.render' has no attribute {name!r}")


__all__ = ["explanation_page", "print_explanations"]
