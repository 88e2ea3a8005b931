"""What every command shares: the two consoles, the progress bar, and loading a model with a
spinner."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

out = Console()
"""Results (tables, heatmaps, JSON) go to stdout."""
err = Console(stderr=True)
"""Status, progress, warnings and errors go to stderr."""


def progress() -> Progress:
    """A transient progress bar on stderr."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


def load_model(name: str, device: str = "cpu"):
    """:func:`heedful.load` with a spinner on stderr (zoo models are built on first use)."""
    import heedful

    with err.status(f"loading {name} …"):
        return heedful.load(name, device=device)
