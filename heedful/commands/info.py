"""``heedful info``: this machine, and which numeric precisions it runs natively and how fast.

Registered in :mod:`heedful.cli`. Heavy imports happen inside the command.
"""

from __future__ import annotations

import json
import os
import platform
from typing import Annotated

import typer


def info(
    device: Annotated[str, typer.Option("--device", help="Device to report on: cpu, cuda, cuda:1, mps.")] = "cpu",
    threads: Annotated[int | None, typer.Option("--threads", help="torch CPU threads the probe runs at (default: torch's choice).")] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Probe again instead of reading the cached result.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show heedful's and torch's versions, the processor (or GPU), the flags lower precision
    depends on, the measured speed of bf16 and int8 forward passes relative to fp32 (a probe
    of a few seconds, cached per machine), and what precision=auto picks here."""
    from dataclasses import asdict

    import torch
    from rich.table import Table

    from heedful.commands.console import out
    from heedful.engine.precision import PRECISIONS, support
    from heedful.errors import HeedfulError
    from heedful.loading import check_device
    from heedful.version import __version__

    found_device = check_device(device)
    if threads is not None:
        if threads < 1:
            raise HeedfulError(f"--threads must be positive, got {threads}")
        torch.set_num_threads(threads)
    found = support(found_device, refresh=refresh)
    picks = auto_picks(found)
    if as_json:
        out.print_json(json.dumps({"heedful": __version__, "python": platform.python_version(), "support": asdict(found), "auto": picks}))
        return
    out.print(f"heedful {__version__} · python {platform.python_version()} · torch {found.torch}", highlight=False)
    where = f"{found.processor} ({platform.machine()}, {os.cpu_count()} logical cores)" if found.device == "cpu" else found.processor
    out.print(f"{found.device}: {where}", highlight=False)
    if found.device == "cpu":
        out.print(f"flags: {found.shown_flags()} · torch CPU capability {torch.backends.cpu.get_cpu_capability()}", highlight=False)
    table = Table(title=f"precision on this machine ({found.probe}, {found.threads} thread(s))")
    for col in ("precision", "hardware", "speed vs fp32 (measured)"):
        table.add_column(col)
    for p in PRECISIONS:
        ratio = found.speed.get(p)
        shown = "cannot run here" if ratio is None else f"{ratio:.2f}x" + (" (slower)" if found.slower(p) else " (faster)" if found.faster(p) else "")
        table.add_row(p, found.routes[p], shown)
    out.print(table)
    chosen = ", ".join(f"{what}: {p}" for what, p in picks.items())
    out.print(f"precision=auto picks -- {chosen}", highlight=False)


def auto_picks(found) -> dict[str, str]:
    """What ``precision="auto"`` resolves to on the machine ``found`` describes: for the
    faithfulness curves and for every method with a ``precision`` option."""
    from heedful.attribution import methods
    from heedful.engine.precision import Tolerates
    from heedful.evaluate.protocol import CURVES_TOLERATE

    picks = {"curves": found.auto(CURVES_TOLERATE)}
    for method in methods():
        if method.takes("precision"):
            picks[method.name] = found.auto((method.option("precision").extra(Tolerates) or Tolerates()).precisions)
    return picks
