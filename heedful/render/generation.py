"""Views of a generation explanation: a terminal matrix (generated tokens as rows, every earlier
token as a column) and a self-contained HTML page where hovering a generated token colours the
text by what that token relied on."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from rich.style import Style
from rich.table import Table
from rich.text import Text

from heedful.render.colors import Scale, scaled_positions
from heedful.render.html import CSS, PAGE_CSS
from heedful.render.terminal import _style

if TYPE_CHECKING:  # render reads explanations as plain data
    from heedful.generation_explanation import GenerationExplanation


def _visible(token: str) -> str:
    """A token as shown in a cell: byte-level and SentencePiece space markers as spaces."""
    return token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\\n")


def _row_scale(row: np.ndarray, special: Sequence[bool], sinks: bool = True) -> Scale:
    return Scale.fit(row, scaled_positions(special, sinks))


LABEL_WIDTH = 10
"""Characters of a token shown as a column or row label (longer ones end in an ellipsis)."""


def _label(token: str) -> str:
    """A token as a column or row label: without its edge spaces (the column, not the space,
    identifies it; a whitespace-only token is already marked), cut to ``LABEL_WIDTH``."""
    shown = token.strip() or token
    return shown if len(shown) <= LABEL_WIDTH else shown[: LABEL_WIDTH - 1] + "…"


def score_decimals(scores: np.ndarray) -> int:
    """Decimals that give the largest finite ``|score|`` at least two significant digits: 2 for
    scores of 0.1 and more, up to 4 for smaller ones."""
    finite = np.abs(scores[np.isfinite(scores)])
    top = float(finite.max()) if finite.size else 0.0
    return 2 if top == 0.0 else int(min(4, max(2, 1 - np.floor(np.log10(top)))))


def score_text(value: float, decimals: int) -> str:
    """``value`` with ``decimals`` decimals and no leading zero before the point (``.39``,
    ``-.05``; ``10.39`` stays ``10.39``)."""
    text = f"{value:.{decimals}f}"
    if text.startswith("0."):
        return text[1:]
    if text.startswith("-0."):
        return "-" + text[2:]
    return text


class GenerationMatrix:
    """The terminal view of a generation explanation: rows are the generated steps (token,
    probability), columns every earlier token, each row coloured on its own scale with its
    ``strongest`` sources underlined (``sinks``: its scale without the first token). Columns that do not fit the console's width wrap into
    bands below one another, each repeating the step labels, so every score is shown at any
    width (a band holds as many columns as fit: about 10 at 80 characters) and a column reads
    the same in every band."""

    def __init__(self, expl: GenerationExplanation, strongest: int = 3, specials: bool = False, sinks: bool = True):
        self.expl = expl
        self.strongest = strongest
        self.sinks = sinks
        width = expl.prompt_length + max(expl.steps - 1, 0)
        self.shown = [j for j in range(width) if specials or not expl.special[j]]
        self.hidden = width - len(self.shown)
        self.decimals = score_decimals(expl.scores[:, self.shown]) if self.shown else 2

    def title(self) -> str:
        expl = self.expl
        sides = "" if expl.source_length is None else " · source │ target prefix"
        return (
            f"{expl.method} · {expl.model} · {expl.quantity} of each generated token{sides}"
            f" ({'forced' if expl.forced else 'generated'}, {expl.steps} steps"
            f"{f'; {self.hidden} special tokens not shown' if self.hidden else ''})"
        )

    def cells(self) -> list[list[Text]]:
        """``[T][len(shown)]`` the score cells, styled (blank where a token was not written yet)."""
        expl, found = self.expl, []
        width = expl.prompt_length + max(expl.steps - 1, 0)
        for t in range(expl.steps):
            row = expl.scores[t, :width]
            scale = _row_scale(row, expl.special[:width], self.sinks)
            ranked = sorted((j for j in self.shown if np.isfinite(row[j]) and not expl.special[j]), key=lambda j: -abs(row[j]))
            top = set(ranked[: self.strongest])
            line = []
            for j in self.shown:
                v = row[j]
                if not np.isfinite(v):
                    line.append(Text(""))
                    continue
                style = _style(scale, float(v), expl.special[j])
                if j in top:
                    style = style + Style(underline=True, bold=True)
                line.append(Text(score_text(float(v), self.decimals), style=style))
            found.append(line)
        return found

    def bands(self, width: int, cells: list[list[Text]]) -> list[list[int]]:
        """Indices into ``shown`` of each band's columns (``cells``: :meth:`cells`), filling
        ``width`` characters."""
        expl = self.expl
        labels = [_label(expl.tokens[j]) for j in self.shown]
        widths = [max([len(labels[c])] + [len(row[c].plain) for row in cells]) for c in range(len(self.shown))]
        generated = max([len("generated")] + [len(_label(t)) for t in expl.generated_tokens])
        room = width - (max(len("step"), len(str(expl.steps - 1))) + 1 + generated + 1 + 4 + 1)
        found: list[list[int]] = [[]]
        used = 0
        for c, w in enumerate(widths):
            if found[-1] and used + w + 1 > room:
                found.append([])
                used = 0
            found[-1].append(c)
            used += w + 1
        if not found[0]:
            return []
        per = -(-len(widths) // len(found))  # as many bands, evened out where they still fit
        even = [list(range(start, min(start + per, len(widths)))) for start in range(0, len(widths), per)]
        fits = len(even) == len(found) and all(sum(widths[c] + 1 for c in band) <= room or len(band) == 1 for band in even)
        return even if fits else found

    def __rich_console__(self, console, options):
        expl = self.expl
        cells = self.cells()
        yield Text(self.title())
        bands = self.bands(options.max_width, cells)
        for b, band in enumerate(bands or [[]]):
            table = Table(show_lines=False, pad_edge=False, box=None, padding=(0, 1, 0, 0))
            table.add_column("step", justify="right", style="dim", min_width=2, no_wrap=True)
            table.add_column("generated", style="bold", no_wrap=True)
            table.add_column("p", justify="right", style="dim", min_width=4, no_wrap=True)
            divided = None  # where an encoder–decoder's target side starts in this band
            for c in band:
                j = self.shown[c]
                if expl.source_length is not None and divided is None and j >= expl.source_length:
                    divided = c
                    table.add_column("│", no_wrap=True, style="dim")
                table.add_column(_label(expl.tokens[j]), justify="right", no_wrap=True, style="dim" if j >= expl.prompt_length else None)
            for t, token in enumerate(expl.generated_tokens):
                row = [cells[t][c] for c in band]
                if divided is not None:
                    row.insert(band.index(divided), Text("│"))
                table.add_row(str(t), _label(token), f"{expl.probabilities[t]:.2f}", *row)
            if len(bands) > 1:
                first, last = self.shown[band[0]], self.shown[band[-1]]
                yield Text(f"tokens {first}–{last} of {len(expl.tokens)}", style="dim")
            yield table
            if b < len(bands) - 1:
                yield Text("")


def generation_table(expl: GenerationExplanation, strongest: int = 3, specials: bool = False, sinks: bool = True) -> GenerationMatrix:
    """The step x token matrix of ``expl`` for the terminal (:class:`GenerationMatrix`; special
    tokens -- template markers, BOS -- only with ``specials``; ``sinks``: each row's colour scale
    leaves the first token out, :func:`~heedful.render.colors.scaled_positions`)."""
    return GenerationMatrix(expl, strongest, specials, sinks)


GENERATION_CSS = """
.hf-gen { margin: 0 0 2rem 0; }
.hf-gen .hf-src .hf-tok { transition: background 0.1s; }
.hf-gen .hf-out .hf-tok { cursor: pointer; border-bottom: 2px solid #999; }
.hf-gen .hf-out .hf-tok.hf-on { border-bottom-color: #000; background: #eee; }
.hf-gen .hf-src .hf-tok.hf-future { opacity: 0.35; }
.hf-gen .hf-label { color: #666; font-size: 0.85em; }
"""

SCRIPT = """
document.querySelectorAll('.hf-gen').forEach(function (box) {
  if (box.hfBound) return;
  box.hfBound = true;
  var data = JSON.parse(box.querySelector('script[type="application/json"]').textContent);
  var src = box.querySelectorAll('.hf-src .hf-tok');
  var out = box.querySelectorAll('.hf-out .hf-tok');
  function show(t) {
    out.forEach(function (el, i) { el.classList.toggle('hf-on', i === t); });
    src.forEach(function (el, j) {
      var v = data.scores[t][j], c = data.colors[t][j];
      if (v === null) { el.style.background = ''; el.style.color = ''; el.classList.add('hf-future'); el.title = ''; return; }
      el.classList.remove('hf-future');
      el.style.background = c[0];
      el.style.color = c[1];
      el.title = (v >= 0 ? '+' : '') + v.toPrecision(4);
    });
    box.querySelector('.hf-step').textContent = data.steps[t];
  }
  out.forEach(function (el, i) { el.addEventListener('mouseenter', function () { show(i); }); });
  show(0);
});
"""
"""Binds every generation view on the page once (a view inserted later is bound when the script
runs again): hovering generated token ``t`` paints each source token with step ``t``'s colours,
computed by :class:`~heedful.render.colors.Scale` (one colour map for every view)."""


SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})
"""JSON escapes for the characters that could end or re-open a ``<script>`` element's text."""


def script_json(data: object) -> str:
    """``data`` as JSON to place inside ``<script type="application/json">``: no ``<``, ``>`` or
    ``&`` appears raw, so no text in it (``</script>``, ``<!--<script>``) can close the element
    or change how the HTML parser reads the rest of the page; ``JSON.parse`` reads it back as is."""
    return json.dumps(data).translate(SCRIPT_SAFE)


def step_colors(expl: GenerationExplanation, sinks: bool = True) -> list[list[tuple[str, str] | None]]:
    """``[T][S]``: the CSS background and text colour of every token for each step (``None``
    where the token was not written yet), each step on its own :class:`Scale` (the views'
    scale positions, ``sinks`` as in :func:`generation_table`)."""
    colors = []
    for row in np.asarray(expl.scores, dtype=float)[:, : len(expl.tokens)]:
        scale = _row_scale(row, expl.special, sinks)
        colors.append([
            None if not np.isfinite(v) else ("rgb({},{},{})".format(*scale.rgb(v)), "rgb({},{},{})".format(*scale.text_rgb(v)))
            for v in row
        ])
    return colors


def generation_fragment(expl: GenerationExplanation, index: int = 0, sinks: bool = True) -> str:
    """One generation: the whole text as tokens (hover a generated token to colour every token
    by its score for that step) and the data it needs, inline (``sinks`` as in
    :func:`generation_table`)."""
    width = len(expl.tokens)
    data = {
        "scores": [[None if not np.isfinite(v) else round(float(v), 6) for v in row[:width]] for row in expl.scores],
        "colors": step_colors(expl, sinks),
        "steps": [
            f"step {t}: {_visible(tok)!r} (p = {p:.3f})"
            for t, (tok, p) in enumerate(zip(expl.generated_tokens, expl.probabilities, strict=True))
        ],
    }
    spans = [
        f'<span class="hf-tok{" hf-special" if expl.special[j] else ""}">{html.escape(_visible(tok))}</span>'
        for j, tok in enumerate(expl.tokens)
    ]
    cut = expl.source_length
    if cut is None:
        text = f'<div class="hf-text hf-src">{"".join(spans)}</div>'
    else:  # an encoder–decoder: its source side and its target side, both lit by a generated token
        text = (
            f'<div class="hf-text hf-src hf-side" data-side="source"><span class="hf-label">source:</span> {"".join(spans[:cut])}</div>'
            f'<div class="hf-text hf-src hf-side" data-side="target"><span class="hf-label">target:</span> {"".join(spans[cut:])}</div>'
        )
    generated = "".join(
        f'<span class="hf-tok">{html.escape(_visible(tok))}</span>' for tok in expl.generated_tokens
    )
    head = (
        f'<div class="hf-head"><b>{html.escape(expl.method)}</b> · {html.escape(expl.model)} · '
        f"{html.escape(expl.quantity)} of each {'forced' if expl.forced else 'generated'} token · "
        f"{expl.steps} steps · {expl.cost.seconds * expl.steps:.3f} s · <span class='hf-step'></span></div>"
    )
    payload = script_json(data)
    return (
        f'<div class="hf-gen" id="hf-gen-{index}">{head}'
        f"{text}"
        f'<div class="hf-text hf-out">generated: {generated}</div>'
        f'<script type="application/json">{payload}</script></div>'
    )


def generation_snippet(expl: GenerationExplanation) -> str:
    """One generation with its style and hover script inline (for notebooks, and the served
    page, which runs the fragments' scripts as it inserts them)."""
    return f"<style>{CSS}{GENERATION_CSS}</style>{generation_fragment(expl)}<script>{SCRIPT}</script>"


def generation_page(explanations: Sequence[GenerationExplanation], title: str = "heedful") -> str:
    """A complete, self-contained page (inline CSS, data and script; nothing fetched)."""
    blocks = "".join(generation_fragment(e, i) for i, e in enumerate(explanations))
    legend = (
        '<div class="hf-legend">Hover a generated token: every earlier token is coloured by its score for '
        "that token (warm: towards it, cool: against it; each step on its own scale). Faded tokens "
        "had not been written yet.</div>"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{PAGE_CSS}{GENERATION_CSS}</style></head><body>"
        f"<h2>{html.escape(title)}</h2>{blocks}{legend}<script>{SCRIPT}</script></body></html>"
    )
