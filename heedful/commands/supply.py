"""``heedful models --sources``: every pinned artefact, where it comes from, and whether the
cached copy checks out.

Registered in :mod:`heedful.cli` (an option of ``heedful models``). One block per artefact
rather than a table: hashes and URLs stay whole on one line each, at any terminal width.
"""

from __future__ import annotations

from rich.markup import escape

from heedful.commands.console import err, out
from heedful.files.cache import heedful_home
from heedful.files.supply import ChecksumError, Status, statuses


def _state(status: Status) -> str:
    """``cached: … · verified: …`` for one artefact."""
    if not status.cached:
        return "cached: no (fetched on first use) · verified: -"
    where = ", ".join(str(p) for p in (status.unpacked, status.archive) if p is not None)
    verified = "[green]yes[/]" if status.verified else "[bold red]NO[/]"
    return f"cached: [green]yes[/] ({escape(where)}) · verified: {verified}"


def source_lines(rows: list[Status]) -> list[str]:
    """The listing as rich-markup lines: per artefact its name, kind and licence, sha256,
    source URL, use, and cache state."""
    lines = [f"[bold]pinned artefacts[/] (cache {escape(str(heedful_home()))})", ""]
    for status in rows:
        pin = status.pin
        lines += [
            f"[bold]{escape(pin.requirement)}[/]  {pin.kind}, {escape(pin.licence)}, {pin.size / 1e6:.1f} MB",
            f"  file     {escape(pin.filename)}",
            f"  sha256   {pin.sha256}",
            f"  source   {escape(pin.url)}",
            f"  used for {escape(pin.purpose)}",
            f"  {_state(status)}",
            "",
        ]
    return lines


def show_sources() -> None:
    """Print the listing (each cached file is hashed); a cached copy that does not match its
    pin is an error (exit code 2) naming it, after the listing."""
    with err.status("hashing the cached artefacts …"):
        rows = statuses()
    for line in source_lines(rows):
        out.print(line, soft_wrap=True, highlight=False)
    bad = [s for s in rows if s.verified is False]
    if bad:
        raise ChecksumError(
            f"{len(bad)} cached artefact(s) do not match their pins: "
            + "; ".join(f"{s.pin.requirement}: {s.problem}" for s in bad),
            hint="delete the files or folders named; heedful downloads and checks them again on next use",
        )
