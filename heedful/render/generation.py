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

from heedful.render.colors import Scale
from heedful.render.html import CSS
from heedful.render.terminal import _style

if TYPE_CHECKING:  # render reads explanations as plain data
    from heedful.generation_explanation import GenerationExplanation


def _visible(token: str) -> str:
    """A token as shown in a cell: byte-level and SentencePiece space markers as spaces."""
    return token.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\\n")


def _row_scale(row: np.ndarray, special: Sequence[bool]) -> Scale:
    return Scale.fit(row, [not s for s in special])


def generation_table(expl: GenerationExplanation, strongest: int = 3, specials: bool = False) -> Table:
    """Rows: generated steps (token, probability); columns: the prompt and generated tokens
    (special tokens -- template markers, BOS -- only with ``specials``). Each row is coloured on
    its own scale; its ``strongest`` sources are underlined."""
    width = expl.prompt_length + max(expl.steps - 1, 0)
    shown = [j for j in range(width) if specials or not expl.special[j]]
    hidden = width - len(shown)
    title = (
        f"{expl.method} · {expl.model} · {expl.quantity} of each generated token"
        f" ({'forced' if expl.forced else 'generated'}, {expl.steps} steps"
        f"{f'; {hidden} special tokens not shown' if hidden else ''})"
    )
    table = Table(title=title, show_lines=False, pad_edge=False, title_justify="left", box=None, padding=(0, 1, 0, 0))
    table.add_column("step", justify="right", style="dim", min_width=2, no_wrap=True)
    table.add_column("generated", style="bold", no_wrap=True)
    table.add_column("p", justify="right", style="dim", min_width=4, no_wrap=True)
    for j in shown:
        table.add_column(_visible(expl.tokens[j]), justify="right", no_wrap=True, style="dim" if j >= expl.prompt_length else None)
    for t, token in enumerate(expl.generated_tokens):
        row = expl.scores[t, :width]
        scale = _row_scale(row, expl.special[:width])
        ranked = sorted((j for j in shown if np.isfinite(row[j]) and not expl.special[j]), key=lambda j: -abs(row[j]))
        top = set(ranked[:strongest])
        cells = []
        for j in shown:
            v = row[j]
            if not np.isfinite(v):
                cells.append(Text(""))
                continue
            style = _style(scale, float(v), expl.special[j])
            if j in top:
                style = style + Style(underline=True, bold=True)
            cells.append(Text(f"{v:.2f}".replace("0.", ".", 1), style=style))
        table.add_row(str(t), _visible(token), f"{expl.probabilities[t]:.2f}", *cells)
    return table


GENERATION_CSS = """
.hf-gen { margin: 0 0 2rem 0; }
.hf-gen .hf-src .hf-tok { transition: background 0.1s; }
.hf-gen .hf-out .hf-tok { cursor: pointer; border-bottom: 2px solid #999; }
.hf-gen .hf-out .hf-tok.hf-on { border-bottom-color: #000; background: #eee; }
.hf-gen .hf-src .hf-tok.hf-future { opacity: 0.35; }
"""

SCRIPT = """
document.querySelectorAll('.hf-gen').forEach(function (box) {
  var data = JSON.parse(box.querySelector('script[type="application/json"]').textContent);
  var src = box.querySelectorAll('.hf-src .hf-tok');
  var out = box.querySelectorAll('.hf-out .hf-tok');
  function show(t) {
    out.forEach(function (el, i) { el.classList.toggle('hf-on', i === t); });
    src.forEach(function (el, j) {
      var v = data.scores[t][j];
      if (v === null) { el.style.background = ''; el.classList.add('hf-future'); el.title = ''; return; }
      el.classList.remove('hf-future');
      var a = Math.min(1, Math.abs(v) / (data.limits[t] || 1));
      var c = v < 0 ? [67, 147, 195] : [214, 96, 77];
      el.style.background = 'rgb(' + c.map(function (x) { return Math.round(255 + (x - 255) * a); }).join(',') + ')';
      el.style.color = a > 0.65 ? '#fff' : '#000';
      el.title = (v >= 0 ? '+' : '') + v.toPrecision(4);
    });
    box.querySelector('.hf-step').textContent = data.steps[t];
  }
  out.forEach(function (el, i) { el.addEventListener('mouseenter', function () { show(i); }); });
  show(0);
});
"""


SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})
"""JSON escapes for the characters that could end or re-open a ``<script>`` element's text."""


def script_json(data: object) -> str:
    """``data`` as JSON to place inside ``<script type="application/json">``: no ``<``, ``>`` or
    ``&`` appears raw, so no text in it (``</script>``, ``<!--<script>``) can close the element
    or change how the HTML parser reads the rest of the page; ``JSON.parse`` reads it back as is."""
    return json.dumps(data).translate(SCRIPT_SAFE)


def generation_fragment(expl: GenerationExplanation, index: int = 0) -> str:
    """One generation: the whole text as tokens (hover a generated token to colour every token
    by its score for that step) and the data it needs, inline."""
    width = len(expl.tokens)
    limits = []
    for t in range(expl.steps):
        finite = [abs(v) for v, s in zip(expl.scores[t], expl.special, strict=True) if np.isfinite(v) and not s]
        limits.append(max(finite) if finite and max(finite) > 0 else 1.0)
    data = {
        "scores": [[None if not np.isfinite(v) else round(float(v), 6) for v in row[:width]] for row in expl.scores],
        "limits": limits,
        "steps": [
            f"step {t}: {_visible(tok)!r} (p = {p:.3f})"
            for t, (tok, p) in enumerate(zip(expl.generated_tokens, expl.probabilities, strict=True))
        ],
    }
    source = "".join(
        f'<span class="hf-tok{" hf-special" if expl.special[j] else ""}">{html.escape(_visible(tok))}</span>'
        for j, tok in enumerate(expl.tokens)
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
        f'<div class="hf-text hf-src">{source}</div>'
        f'<div class="hf-text hf-out">generated: {generated}</div>'
        f'<script type="application/json">{payload}</script></div>'
    )


def generation_snippet(expl: GenerationExplanation) -> str:
    """One generation with its style and script inline (for notebooks)."""
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
        f"<title>{html.escape(title)}</title><style>{CSS}{GENERATION_CSS}</style></head><body>"
        f"<h2>{html.escape(title)}</h2>{blocks}{legend}<script>{SCRIPT}</script></body></html>"
    )
