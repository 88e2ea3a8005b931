"""Layer grids (causal traces, patching): rows are layers, columns decoded tokens or heads, each
cell on a background coloured by its value -- in the terminal and as HTML."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

import numpy as np
from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from heedful.render.colors import Scale
from heedful.render.html import PAGE_CSS
from heedful.render.terminal import _style

if TYPE_CHECKING:  # render reads traces as plain data
    from heedful.inside.tracing import Trace


def digits_for(values: np.ndarray) -> int:
    """Decimals that show the grid's largest magnitude with two significant digits (2 to 5)."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 0.0
    return 2 if top == 0 else int(min(5, max(2, 1 - math.floor(math.log10(top)))))


def grid_table(values: np.ndarray, columns: list[str], title: str, marked: frozenset[int] = frozenset()) -> Table:
    """``values`` ``[L, K]`` as a table: a row per layer, a column per token / head (``marked``
    columns -- the corrupted tokens -- starred), NaN cells blank."""
    scale, digits = Scale.fit(values), digits_for(values)
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), title_justify="left")
    table.add_column("layer", justify="right", style="dim")
    for k, name in enumerate(columns):
        shown = repr(name)[1:-1] if name.strip() else repr(name)
        table.add_column(("*" if k in marked else "") + shown, justify="right", no_wrap=True)
    for layer, row in enumerate(values):
        cells = [Text(str(layer))]
        for v in row:
            cells.append(Text("" if not math.isfinite(v) else f"{v:.{digits}f}", style=_style(scale, float(v))))
        table.add_row(*cells)
    return table


def _summary(trace: Trace) -> str:
    against = f" against {trace.counterfactual!r}" if trace.counterfactual else f", {trace.samples} noise samples"
    window = f", window {trace.window}" if trace.window > 1 else ""
    contrast = f" - {trace.contrast!r}" if trace.contrast else ""
    done = "" if trace.complete else f"  (interrupted: {int(np.isfinite(trace.effect).all(axis=1).sum())} of {trace.layers} layers computed)"
    return (
        f"{trace.prompt!r}{against}: {trace.metric}({trace.target!r}{contrast}) clean {trace.clean_score:.4g}, "
        f"corrupted {trace.corrupted_score:.4g}; indirect effect of restoring {trace.kind} ({trace.role}){window}{done}"
    )


def _agreement(trace: Trace) -> str:
    parts = []
    if trace.atp is not None:
        parts.append(f"AtP vs exact: Spearman {trace.spearman:+.3f}")
    if trace.graddrop is not None:
        parts.append(f"GradDrop vs |exact|: Spearman {trace.graddrop_spearman:+.3f}")
    parts.append(f"exact grid {trace.seconds:.2f} s in {trace.passes} batched passes; gradient estimates {trace.atp_seconds:.2f} s")
    return "; ".join(parts)


def _grids(trace: Trace) -> list[tuple[np.ndarray, str]]:
    """The grids a trace shows, with their titles: the exact one, then the estimates it has."""
    found = [(trace.effect, "exact (patching)"), (trace.atp, "AtP (gradient)"), (trace.graddrop, "GradDrop |AtP*|")]
    return [(values, title) for values, title in found if values is not None]


def _marked(trace: Trace) -> frozenset[int]:
    """The columns to star: the corrupted tokens (none in a head grid)."""
    return frozenset(trace.corrupted) if trace.kind != "head" else frozenset()


def trace_renderable(trace: Trace) -> RenderableType:
    """The exact grid, AtP's (and GradDrop's) beside it, and their agreement."""
    marked = _marked(trace)
    tables = [grid_table(values, trace.columns, title, marked) for values, title in _grids(trace)]
    return Group(Text(_summary(trace)), SideBySide(tables), Text(_agreement(trace), style="dim"))


class SideBySide:
    """Tables side by side where the console is wide enough for them all, else one under another."""

    GAP = 3

    def __init__(self, tables: list[Table]) -> None:
        self.tables = tables

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [Measurement.get(console, options, t).maximum for t in self.tables]
        if sum(widths) + self.GAP * (len(widths) - 1) <= options.max_width:
            grid = Table.grid(padding=(0, self.GAP))
            for width in widths:
                grid.add_column(min_width=width)
            grid.add_row(*self.tables)
            yield grid
            return
        for table in self.tables:
            yield table
            yield Text("")


def grid_html(values: np.ndarray, columns: list[str], title: str, marked: frozenset[int] = frozenset()) -> str:
    """``values`` ``[L, K]`` as an HTML table coloured like the terminal's."""
    scale, digits = Scale.fit(values), digits_for(values)
    head = "".join(f"<th>{'*' if k in marked else ''}{html.escape(c)}</th>" for k, c in enumerate(columns))
    rows = []
    for layer, row in enumerate(values):
        cells = []
        for v in row:
            if not math.isfinite(v):
                cells.append("<td></td>")
                continue
            bg, fg = scale.rgb(float(v)), scale.text_rgb(float(v))
            cells.append(f'<td style="background: rgb{bg}; color: rgb{fg}" title="{v:.6g}">{v:.{digits}f}</td>')
        rows.append(f"<tr><th>{layer}</th>{''.join(cells)}</tr>")
    return f'<table class="hf-grid"><caption>{html.escape(title)}</caption><tr><th>layer</th>{head}</tr>{"".join(rows)}</table>'


GRID_CSS = """
.hf-grid { border-collapse: collapse; font-size: 0.8rem; margin: 0 1.5rem 1rem 0; display: inline-table; vertical-align: top; }
.hf-grid td, .hf-grid th { padding: 0.1rem 0.4rem; text-align: right; white-space: pre; }
.hf-grid caption { text-align: left; font-weight: 600; }
"""


def trace_fragment(trace: Trace) -> str:
    """The grids and their agreement as an HTML fragment (a notebook's ``_repr_html_``)."""
    marked = _marked(trace)
    tables = [grid_html(values, trace.columns, title, marked) for values, title in _grids(trace)]
    return (
        f"<style>{GRID_CSS}</style><div class='hf-expl'><p>{html.escape(_summary(trace))}</p>{''.join(tables)}"
        f"<p>{html.escape(_agreement(trace))}. Starred columns: corrupted tokens.</p></div>"
    )


def trace_page(trace: Trace) -> str:
    """A complete, self-contained HTML page of :func:`trace_fragment`."""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>heedful trace</title>"
        f"<style>{PAGE_CSS}{GRID_CSS}</style></head><body><h2>Causal trace</h2>{trace_fragment(trace)}</body></html>"
    )
