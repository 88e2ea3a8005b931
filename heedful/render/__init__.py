"""Showing explanations to a person: terminal heatmaps, HTML pages, plots."""

from heedful.render.html import explanation_page
from heedful.render.terminal import print_explanations

__all__ = ["explanation_page", "print_explanations"]
