"""The faithfulness-cost frontier of the built-in methods, as ``benchmarks/frontier.py`` measured
it: ``heedful/frontier.json`` beside the package (generated, never edited by hand), read without
importing torch so that ``heedful methods`` and the page's method picker can show it.

Per task (``classification``): the model and examples it was measured on, and per method its
cost in forward-pass equivalents per example (a backward counts two, Kaplan et al. 2020), its
AOPC under the protocol's own removal with the 95 % bootstrap interval, whether it is on the
Pareto front (no other method is at most as costly and more faithful), and, for a method the
frontier's results store held fewer sentences of than the task's, how many it was measured on.
A row measured with options other than the method's defaults is keyed by a label naming them
(``solvability_beam[objective=both]``) and records its ``options``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FRONTIER = Path(__file__).resolve().parent / "frontier.json"
"""Where ``benchmarks/frontier.py`` writes the frontier (package data)."""


@dataclass(frozen=True)
class Point:
    """One row on one task: ``label`` (the method's name, or the name and options such as
    ``solvability_beam[objective=both]``), ``cost`` (forward-pass equivalents per example),
    ``aopc`` and its 95 % interval ``low`` / ``high``, ``front``: on the Pareto front;
    ``examples``: the sentences it was measured on when fewer than the task's (``None``: all of
    them); ``options``: the options that differ from the method's defaults (``None``: none)."""

    label: str
    cost: float
    aopc: float
    low: float
    high: float
    front: bool
    examples: int | None = None
    options: dict | None = None

    @property
    def method(self) -> str:
        """The registered method the row ran."""
        return self.label.partition("[")[0]

    def describe(self) -> str:
        """``"≈ 201 forward passes per example; AOPC 0.617 [0.597, 0.636]"`` (``"... on 120
        sentences"`` for a method measured on fewer than the task's)."""
        on = "" if self.examples is None else f" on {self.examples} sentences"
        cost = f"{self.cost:,.0f}"
        return f"≈ {cost} forward {'pass' if cost == '1' else 'passes'} per example; AOPC {self.aopc:.3f} [{self.low:.3f}, {self.high:.3f}]{on}"


@lru_cache(maxsize=4)
def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def points(task: str) -> dict[str, Point]:
    """Every measured row of ``task`` by label (empty when the frontier was not measured)."""
    found = (_read(FRONTIER).get("tasks") or {}).get(task) or {}
    return {name: Point(name, **row) for name, row in (found.get("methods") or {}).items()}


def measured_on(task: str) -> str | None:
    """``"minilm-sentiment, 60 movies test sentences"``: what the frontier of ``task`` was measured on."""
    found = (_read(FRONTIER).get("tasks") or {}).get(task)
    return None if not found else f"{found['model']}, {found['examples']} {found['data']}"


def front(task: str) -> list[str]:
    """The rows (labels) on ``task``'s Pareto front, cheapest first."""
    return [p.label for p in sorted(points(task).values(), key=lambda p: p.cost) if p.front]


def front_marks(task: str, method: str) -> list[str]:
    """How ``method`` is on ``task``'s front: ``""`` for its defaults, ``"objective=both"`` for a
    row with other options (empty list: not on the front)."""
    return [", ".join(f"{k}={v}" for k, v in (p.options or {}).items())
            for p in sorted(points(task).values(), key=lambda p: p.cost) if p.front and p.method == method]


def row(task: str | None, method: str) -> dict | None:
    """What the page shows of ``method`` at its defaults on ``task``'s frontier (``None``: not
    measured)."""
    point = points(task).get(method) if task else None
    if point is None:
        return None
    return {"cost": point.cost, "aopc": point.aopc, "low": point.low, "high": point.high, "front": point.front,
            "text": point.describe(), "measured_on": measured_on(task)}
