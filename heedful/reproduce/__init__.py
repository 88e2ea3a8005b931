"""Reproduction reports: one command per founding paper regenerates ``docs/results/<name>.md``.

Each report is a package of this one (``run``, ``statistics``, ``plots``, ``markdown``,
``claims``) whose ``write(out_dir, settings) -> Path`` runs the paper's experiments on the
zoo models (through :func:`heedful.evaluate.run_bench` and the studies), writes the markdown
report and its plots into ``out_dir`` and returns the report's path; what they share (the
verdicts, interval text, Spearman, options, coverage lists) is :mod:`heedful.reproduce.toolkit`.
``REPORTS`` is the one place that lists them; ``heedful reproduce NAME`` runs one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from heedful.errors import HeedfulError


@dataclass(frozen=True)
class ReportSettings:
    """What every report accepts.

    ``n``: examples per dataset (None = the report's documented default);
    ``quick``: a small smoke run (few examples, few steps) that checks the
    pipeline end to end in minutes — its numbers are not the report's;
    ``store``: the results-store folder (explanations are reused between runs);
    ``progress``: progress bars on stderr.
    """

    n: int | None = None
    quick: bool = False
    store: Path | None = None
    progress: bool = True
    options: dict = field(default_factory=dict)


#: name -> (module in this package, one-line description)
REPORTS: dict[str, tuple[str, str]] = {
    "normxlogit": ("normxlogit", "NormXLogit / LogAt: faithfulness (Exp. 1) and layer-wise evidence alignment (Exp. 2)"),
    "mask-lrp": ("mask_lrp", "Mask-LRP: Table 1 analogue, AOPC / log-odds against k, head maps"),
    "coperturbation": ("coperturbation", "Co-perturbation: rectification, layer map, lambda sweep, faithfulness"),
    "lecture": ("lecture", "The lecture's probes, causal traces, steering vectors and counterfactual tests"),
}


def report_writer(name: str) -> Callable[[Path, ReportSettings], Path]:
    """The ``write`` function of report ``name``; a HeedfulError listing the reports otherwise."""
    if name not in REPORTS:
        raise HeedfulError(f"unknown report {name!r}", hint=f"known reports: {', '.join(REPORTS)}")
    module = importlib.import_module(f"heedful.reproduce.{REPORTS[name][0]}")
    return module.write


def default_out_dir() -> Path:
    """``docs/results`` of the current directory."""
    return Path("docs") / "results"
