"""``heedful reproduce NAME``: regenerate a paper's reproduction report under docs/results.

Registered in :mod:`heedful.cli`. Heavy imports happen inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from heedful.commands.options import options as key_values
from heedful.errors import HeedfulError


def reproduce(
    name: Annotated[str, typer.Argument(help="Report: normxlogit, mask-lrp, coperturbation or lecture.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for the report and plots (default docs/results; docs/results/quick with --quick or -O only=SECTION).")] = None,
    n: Annotated[int | None, typer.Option("--n", "-n", help="Examples per dataset (default: the report's).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smoke run: few examples and steps; numbers are not the report's.")] = False,
    store: Annotated[Path | None, typer.Option("--store", help="Results-store folder (reused between runs).")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", "-O", help="Report-specific setting key=value (mask-lrp: only=planted runs its planted precision@20 section alone).")] = None,
) -> None:
    """Run a founding paper's experiments on the zoo models and write ``<out>/<name>.md`` with plots.

    Explanations are kept in a results store, so a second run (or a run after an
    interruption) only computes what is missing.
    """
    from heedful.reproduce import REPORTS, ReportSettings, default_out_dir, report_writer

    if name not in REPORTS:
        raise HeedfulError(f"unknown report {name!r}", hint=f"known reports: {', '.join(REPORTS)}")
    options = key_values(option, "--option ig_steps=20")
    if n is not None and n < 1:
        raise HeedfulError(f"--n must be at least 1, got {n}", hint="drop --n for the report's own count")
    from heedful.commands.console import check_writable

    for flag, folder in (("--out", out), ("--store", store)):
        if folder is not None:
            check_writable(folder, flag, folder=True)  # before hours of work
    settings = ReportSettings(n=n, quick=quick, store=store, options=options)
    if out is None:
        # a smoke run, or one section alone, never writes beside the committed reports
        out = default_out_dir() / "quick" if quick or options.get("only") else default_out_dir()
    path = report_writer(name)(out, settings)
    Console().print(f"wrote {path}", markup=False, highlight=False)
