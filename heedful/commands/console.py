"""What every command shares: the two consoles, the progress bar, and loading a model with a
spinner."""

from __future__ import annotations

from rich.console import Console

from heedful.render.progress import LoggedProgress, progress_bar

out = Console()
"""Results (tables, heatmaps, JSON) go to stdout."""
err = Console(stderr=True)
"""Status, progress, warnings and errors go to stderr."""


def progress() -> LoggedProgress:
    """A transient progress bar on stderr."""
    return progress_bar(err)


def load_model(name: str, device: str = "cpu", max_memory: int | str | None = None):
    """:func:`heedful.load` with a spinner on stderr (zoo models are built on first use);
    ``max_memory``: the budget of one pass (see :mod:`heedful.memory`)."""
    import heedful

    with err.status(f"loading {name} …"):
        return heedful.load(name, device=device, max_memory=max_memory)
