"""Self-contained HTML for explanations: one file, inline CSS, no scripts or network fetches."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from heedful.render.colors import Scale, scaled_positions
from heedful.render.layout import Piece, pieces, prediction_said, shown_label
from heedful.render.sources import sources_html

if TYPE_CHECKING:  # render reads explanations as plain data; heedful.explanation imports render
    from heedful.explanation import Explanation


_FONT = "font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; color: #222;"

CSS = f"\n.hf-expl, .hf-many, .hf-gen, .hf-legend {{ {_FONT} }}" + """
.hf-expl { margin: 0 0 1.6rem 0; }
.hf-head { font-size: 0.85rem; color: #555; margin-bottom: 0.35rem; }
.hf-head b { color: #111; }
.hf-text { font-size: 1.1rem; line-height: 2.1; }
.hf-tok { padding: 0.15rem 0.1rem; border-radius: 0.2rem; }
.hf-special { font-size: 0.75rem; opacity: 0.7; }
table.hf-grid { border-collapse: collapse; font-size: 0.8rem; }
table.hf-grid td, table.hf-grid th { padding: 0.2rem 0.35rem; text-align: center; }
table.hf-cmp td { vertical-align: top; padding: 0.4rem 0.8rem; }
.hf-legend { font-size: 0.8rem; color: #555; margin-top: 1rem; }
.hf-sources { font-size: 1rem; line-height: 1.8; white-space: pre-wrap; }
.hf-source { padding: 0.1rem 0; border-radius: 0.2rem; }
.hf-outside { color: #777; }
table.hf-ranking { font-size: 0.85rem; margin-bottom: 0.8rem; }
"""
"""The style of heedful's HTML, every rule scoped to its own ``hf-`` classes: a fragment (a
notebook's ``_repr_html_``) carries it without restyling the page around it."""

PAGE_CSS = f"body {{ {_FONT} margin: 2rem; }}\n" + CSS
""":data:`CSS` and the page's own body style, for heedful's complete pages only."""


def _span(piece: Piece, scale: Scale) -> str:
    """A scored piece: its text on its score's colour, the tooltip saying what it reads as and
    its score, the tokenizer's raw token (when it is one) in ``data-token``. Every string escaped,
    attributes quoted."""
    bg = "rgb({},{},{})".format(*scale.rgb(piece.score))
    fg = "rgb({},{},{})".format(*scale.text_rgb(piece.score))
    cls = "hf-tok hf-special" if piece.special else "hf-tok"
    token = f' data-token="{html.escape(piece.token)}"' if piece.token else ""
    return (
        f'<span class="{cls}" style="background:{bg};color:{fg}" '
        f'title="{html.escape(piece.title)}"{token}>{html.escape(piece.text)}</span>'
    )


def heatmap_html(expl: Explanation, words: bool = False, layer: int = -1, sinks: bool = True) -> str:
    scores = expl.scores[layer] if expl.layerwise else expl.scores
    scale = Scale.fit(scores, scaled_positions(expl.special, sinks))
    parts = []
    for piece in pieces(expl, words=words, layer=layer):
        if piece.score is None:
            parts.append(html.escape(piece.text))
        else:
            parts.append(_span(piece, scale))
    return f'<div class="hf-text">{"".join(parts)}</div>'


def layer_grid_html(expl: Explanation, words: bool = False, sinks: bool = True) -> str:
    if words:
        ws = expl.words("sum")
        labels, grid, include = ws.words, ws.scores, None
    else:
        labels, grid, include = expl.tokens, expl.scores, scaled_positions(expl.special, sinks)
    scale = Scale.fit(grid, include)
    head = "".join(f"<th>{html.escape(lab)}</th>" for lab in labels)
    rows = []
    for layer, row in enumerate(np.atleast_2d(grid), start=1):
        cells = "".join(
            '<td style="background:rgb({},{},{})" title="{:+.4g}">{:+.2f}</td>'.format(*scale.rgb(v), v, v)
            for v in row
        )
        rows.append(f"<tr><th>layer {layer}</th>{cells}</tr>")
    return f'<table class="hf-grid"><tr><th></th>{head}</tr>{"".join(rows)}</table>'


def _header_html(expl: Explanation) -> str:
    said = prediction_said(expl)
    said = f" · {html.escape(said)}" if said else ""
    return (
        f'<div class="hf-head"><b>{html.escape(expl.method)}</b> · {html.escape(expl.model)} · '
        f"explaining {html.escape(shown_label(expl.target.label))}{said} · {expl.cost.seconds:.3f} s</div>"
    )


def _body(expl: Explanation, words: bool, sinks: bool = True) -> str:
    if expl.sources is not None:
        return sources_html(expl)
    return layer_grid_html(expl, words, sinks) if expl.layerwise else heatmap_html(expl, words, sinks=sinks)


def explanation_fragment(expl: Explanation, words: bool = False, sinks: bool = True) -> str:
    """HTML for one explanation (no page wrapper; used for notebooks). ``sinks``: the first
    token left out of the colour scale (:func:`~heedful.render.colors.scaled_positions`)."""
    body = _body(expl, words, sinks)
    return f'<div class="hf-expl"><style>{CSS}</style>{_header_html(expl)}{body}</div>'


def explanations_fragment(explanations: Sequence[Explanation], words: bool = False, sinks: bool = True) -> str:
    """HTML for several explanations (no page wrapper; a list's ``_repr_html_`` in notebooks):
    each one's :func:`explanation_fragment` in order, inside one ``hf-many`` box. ``heedful serve``'s
    page shows these same fragments, one per method."""
    return f'<div class="hf-many">{"".join(explanation_fragment(e, words, sinks) for e in explanations)}</div>'


def explanation_page(
    explanations: Sequence[Explanation], words: bool = False, title: str = "heedful", sinks: bool = True
) -> str:
    """A complete, self-contained HTML page; several methods on one text are laid out together
    (``sinks`` as in :func:`explanation_fragment`)."""
    blocks = []
    for expl in explanations:
        body = _body(expl, words, sinks)
        blocks.append(f'<div class="hf-expl">{_header_html(expl)}{body}</div>')
    legend = (
        '<div class="hf-legend">Warm: the token pushes towards the explained output; cool: against it. '
        "Hover a token for what it reads as (␣ a space, ⏎ a line break) and its score. Colours are scaled per explanation"
        + (", without the special tokens and the first token (an attention sink in many decoders)" if sinks else ", without the special tokens")
        + ".</div>"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{PAGE_CSS}</style></head><body>"
        f"<h2>{html.escape(title)}</h2>{''.join(blocks)}{legend}</body></html>"
    )
