"""``heedful models --sources``: every pinned artefact, where it comes from, and whether the
cached copy checks out.

Registered in :mod:`heedful.cli` (an option of ``heedful models``).
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from heedful.cache import heedful_home
from heedful.commands.console import err, out
from heedful.supply import ChecksumError, Status, statuses


def _cell(status: Status) -> tuple[str, str]:
    """The "cached" and "verified" cells of one row."""
    if not status.cached:
        return "no", "-"
    where = status.unpacked or status.archive
    cached = f"[green]yes[/] ({escape(where.name)})" if where is not None else "yes"
    return cached, "[green]yes[/]" if status.verified else "[bold red]NO[/]"


def sources_table(rows: list[Status]) -> Table:
    """One row per pin: artefact, kind, sha256, source URL, cached, verified, used for."""
    table = Table(title=f"pinned artefacts  ({heedful_home()})")
    table.add_column("artefact", no_wrap=True, style="bold")
    for col in ("kind", "sha256", "source", "cached", "verified", "used for"):
        table.add_column(col, overflow="fold")
    for status in rows:
        pin = status.pin
        cached, verified = _cell(status)
        table.add_row(
            escape(pin.requirement), pin.kind, pin.sha256, escape(pin.url), cached, verified, escape(pin.purpose)
        )
    return table


def show_sources() -> None:
    """Print the table (each cached file is hashed); a cached copy that does not match its pin
    is an error (exit code 2) naming it, after the table."""
    with err.status("hashing the cached artefacts …"):
        rows = statuses()
    out.print(sources_table(rows))
    bad = [s for s in rows if s.verified is False]
    if bad:
        raise ChecksumError(
            f"{len(bad)} cached artefact(s) do not match their pins: "
            + "; ".join(f"{s.pin.requirement}: {s.problem}" for s in bad),
            hint="delete the files or folders named; heedful downloads and checks them again on next use",
        )
