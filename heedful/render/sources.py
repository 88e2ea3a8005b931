"""Source views of an explanation: the sources ranked by score, and the text with each source
on a background coloured by its score (terminal with rich, and self-contained HTML)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from heedful.render.colors import Scale

if TYPE_CHECKING:  # render reads explanations as plain data; heedful.explanation imports render
    from heedful.explanation import Explanation, SourceScores

SHOWN = 10
"""Sources listed in the ranking (the text shows them all)."""
PREVIEW = 110
"""Characters of a source's text in the ranking."""


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW else flat[: PREVIEW - 1] + "…"


def _pieces(expl: Explanation, pooled: SourceScores) -> list[tuple[str, int | None]]:
    """The text cut at source boundaries: ``(piece, source index or None)``."""
    found, at = [], 0
    for index, (start, end) in sorted(enumerate(pooled.spans), key=lambda s: s[1][0]):
        if start > at:
            found.append((expl.text[at:start], None))
        found.append((expl.text[start:end], index))
        at = max(at, end)
    if at < len(expl.text):
        found.append((expl.text[at:], None))
    return found


def sources_renderable(expl: Explanation, header: Text, shown: int = SHOWN) -> RenderableType:
    """The ``shown`` best sources ranked with their scores, then the whole text with every
    source coloured by its score."""
    pooled = expl.source_scores()
    scores = pooled.scores[-1] if pooled.scores.ndim > 1 else pooled.scores
    scale = Scale.fit(scores)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("rank", justify="right")
    table.add_column("source", justify="right")
    table.add_column("score", justify="right")
    table.add_column("text")
    for rank, (index, text, score) in enumerate(pooled.ranked()[:shown], start=1):
        table.add_row(str(rank), str(index), f"{score:+.4f}", _preview(text))
    body = Text()
    for piece, index in _pieces(expl, pooled):
        if index is None:
            body.append(piece, style="dim")
        else:
            bg = "rgb({},{},{})".format(*scale.rgb(float(scores[index])))
            fg = "rgb({},{},{})".format(*scale.text_rgb(float(scores[index])))
            body.append(piece, style=f"{fg} on {bg}")
    more = len(pooled.words) - shown
    note = Text(f"{len(pooled.words)} sources ({pooled.aggregation} of token scores)" + (f"; {more} more below the ranking" if more > 0 else ""), style="dim")
    return Group(header, table, note, Text(), body)


def sources_html(expl: Explanation, shown: int = SHOWN) -> str:
    """HTML of :func:`sources_renderable`: a ranking table and the text with every source
    coloured by its score (hover a source for its rank and score)."""
    pooled = expl.source_scores()
    scores = pooled.scores[-1] if pooled.scores.ndim > 1 else pooled.scores
    scale = Scale.fit(scores)
    ranked = pooled.ranked()
    rank_of = {index: rank for rank, (index, _, _) in enumerate(ranked, start=1)}
    rows = "".join(
        f"<tr><td>{rank}</td><td>{index}</td><td>{score:+.4f}</td><td>{html.escape(_preview(text))}</td></tr>"
        for rank, (index, text, score) in enumerate(ranked[:shown], start=1)
    )
    parts = []
    for piece, index in _pieces(expl, pooled):
        if index is None:
            parts.append(f'<span class="hf-outside">{html.escape(piece)}</span>')
            continue
        score = float(scores[index])
        bg = "rgb({},{},{})".format(*scale.rgb(score))
        fg = "rgb({},{},{})".format(*scale.text_rgb(score))
        title = f"source {index} · rank {rank_of[index]} · {score:+.4f}"
        parts.append(f'<span class="hf-source" style="background:{bg};color:{fg}" title="{html.escape(title)}">{html.escape(piece)}</span>')
    table = f'<table class="hf-cmp hf-ranking"><tr><th>rank</th><th>source</th><th>score</th><th>text</th></tr>{rows}</table>'
    return f'{table}<div class="hf-text hf-sources">{"".join(parts)}</div>'
