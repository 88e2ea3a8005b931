"""Terminal heatmaps with rich: tokens (or words) on a background coloured by their score."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

from heedful.render.colors import Scale, scaled_positions
from heedful.render.layout import pieces, prediction_said, shown_label
from heedful.render.sources import sources_renderable

if TYPE_CHECKING:  # render reads explanations as plain data; heedful.explanation imports render
    from heedful.explanation import Explanation


def _style(scale: Scale, score: float, special: bool = False) -> Style:
    bg = "rgb({},{},{})".format(*scale.rgb(score))
    fg = "rgb({},{},{})".format(*scale.text_rgb(score))
    return Style(bgcolor=bg, color=fg, dim=special)


def heatmap_text(expl: Explanation, words: bool = False, layer: int = -1, sinks: bool = True) -> Text:
    """The text with each token / word on a background coloured by its score (``sinks``: the
    first token left out of the colour scale, :func:`~heedful.render.colors.scaled_positions`)."""
    scores = expl.scores[layer] if expl.layerwise else expl.scores
    scale = Scale.fit(scores, scaled_positions(expl.special, sinks))
    text = Text()
    for piece in pieces(expl, words=words, layer=layer):
        if piece.score is None:
            text.append(piece.text)
        else:
            text.append(piece.text, style=_style(scale, piece.score, piece.special))
    return text


def header(expl: Explanation) -> Text:
    """``method · model · target (prediction)``."""
    said = prediction_said(expl)
    head = Text()
    head.append(expl.method, style="bold")
    head.append(f"  ·  {expl.model}  ·  explaining {shown_label(expl.target.label)}", style="dim")
    if said:
        head.append(f"  ·  {said}", style="dim")
    if expl.truncated:
        head.append("  ·  truncated", style="yellow")
    return head


def layer_table(expl: Explanation, words: bool = False, sinks: bool = True) -> Table:
    """Layer x token grid for layer-wise scores (one row per layer, 1..L); ``sinks`` as in
    :func:`heatmap_text`."""
    if words:
        ws = expl.words("sum")
        labels, grid = ws.words, ws.scores
    else:
        labels, grid = expl.tokens, expl.scores
    include = None if words else scaled_positions(expl.special, sinks)
    scale = Scale.fit(grid, include)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("layer", justify="right", style="dim")
    for label in labels:
        table.add_column(label, justify="center")
    for layer, row in enumerate(np.atleast_2d(grid), start=1):
        cells = [Text(f"{v:+.2f}", style=_style(scale, float(v))) for v in row]
        table.add_row(str(layer), *cells)
    return table


def explanation_renderable(expl: Explanation, words: bool = False, sinks: bool = True) -> RenderableType:
    """Header plus heatmap (or layer grid) for one explanation; an explanation cut into sources
    shows its sources ranked and the text coloured source by source."""
    if expl.sources is not None:
        return Group(sources_renderable(expl, header(expl)), Text(""))
    body = layer_table(expl, words, sinks) if expl.layerwise else heatmap_text(expl, words, sinks=sinks)
    return Group(header(expl), body, Text(""))


def comparison_table(explanations: Sequence[Explanation], words: bool = False, sinks: bool = True) -> Table:
    """Several methods on one text, one row each, aligned for comparison."""
    table = Table(show_header=True, header_style="bold", expand=False)
    table.add_column("method", style="bold", no_wrap=True)
    table.add_column("attribution")
    table.add_column("s / text", justify="right", style="dim")
    for expl in explanations:
        body = layer_table(expl, words, sinks) if expl.layerwise else heatmap_text(expl, words, sinks=sinks)
        table.add_row(expl.method, body, f"{expl.cost.seconds:.3f}")
    return table


def print_explanations(
    explanations: Sequence[Explanation], words: bool = False, console: Console | None = None, sinks: bool = True
) -> None:
    """Print explanations; several methods on the same text are shown side by side (``sinks``:
    the first token left out of each colour scale, :func:`~heedful.render.colors.scaled_positions`)."""
    console = console or Console()
    by_text: dict[tuple[str, str | None], list[Explanation]] = {}
    for expl in explanations:
        by_text.setdefault((expl.text, expl.text_pair), []).append(expl)
    for group in by_text.values():
        if len(group) > 1 and all(e.sources is not None for e in group):
            for expl in group:
                console.print(explanation_renderable(expl, words, sinks))
        elif len(group) > 1:
            first = group[0]
            console.print(
                Text(f"{first.model}  ·  explaining {shown_label(first.target.label)}", style="dim"),
            )
            console.print(comparison_table(group, words, sinks))
        else:
            console.print(explanation_renderable(group[0], words, sinks))
