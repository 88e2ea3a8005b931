"""Hostile text in the HTML views: markup in a text or in generated tokens is shown, never run
(the export, the notebook repr, the generation view's inline data), and tooltips read the
decoded token, not the tokenizer's byte-level symbol. (A real browser loads these views in
tests/test_serve_browser.py.)"""

from __future__ import annotations

import json
import re

import numpy as np

from heedful.explanation import Explanation, TargetInfo
from heedful.generation_explanation import GenerationExplanation

IMG = '"><img src=x onerror=alert(1)>'
SCRIPT = "</script><script>window.__pwned=1</script>"
REOPEN = "<!--<script>"
"""Inside a script element, ``<!--<script>`` puts the HTML parser in a state where the next
``</script>`` no longer ends the element (the rest of the page is swallowed as script text)."""


def _byte_level(text: str, words: list[str]) -> tuple[list[str], list[tuple[int, int]]]:
    """GPT-2-style tokens of ``text`` (``Ġ`` for a leading space) and offsets that leave the space
    out (``trim_offsets``), for words given in order."""
    tokens, offsets, at = [], [], 0
    for word in words:
        start = text.index(word, at)
        tokens.append(("Ġ" if start > 0 and text[start - 1] == " " else "") + word)
        offsets.append((start, start + len(word)))
        at = start + len(word)
    return tokens, offsets


def _explanation() -> Explanation:
    text = f"he wrote {IMG} and </ then {SCRIPT}"
    words = ["he", "wrote", IMG, "and", "</", "then", SCRIPT]
    tokens, offsets = _byte_level(text, words)
    n = len(tokens)
    return Explanation(
        text=text, text_pair=None, tokens=tokens, offsets=offsets, word_ids=list(range(n)), special=[False] * n,
        segments=[0] * n, scores=np.linspace(-1.0, 1.0, n), target=TargetInfo("predicted", [1], SCRIPT, n - 1),
        method="demo", model=IMG, prediction={"label": SCRIPT, "probability": 0.5},
    )


def _generation() -> GenerationExplanation:
    prompt = f"say {IMG}"
    generated = [" </", "script", "><", REOPEN, SCRIPT]
    text = prompt + "".join(generated)
    tokens = ["say", "Ġ" + IMG.replace(" ", "Ġ"), *(g.replace(" ", "Ġ") for g in generated)]
    offsets, at = [], 0
    for piece in ["say", " " + IMG, *generated]:
        offsets.append((at, at + len(piece)))
        at += len(piece)
    s, p = len(tokens), 2
    scores = np.full((len(generated), s), np.nan)
    for t in range(len(generated)):
        scores[t, : p + t] = np.arange(1, p + t + 1, dtype=float)
    return GenerationExplanation(
        prompt=prompt, text=text, tokens=tokens, offsets=offsets, word_ids=list(range(s)), special=[False] * s,
        prompt_length=p, scores=scores, probabilities=np.full(len(generated), 0.25), method="demo", model=IMG,
    )


def _no_markup(html: str) -> None:
    assert "<img" not in html
    assert "<script>window" not in html and "window.__pwned=1</script>" not in html


def test_every_html_view_escapes_markup_in_texts_and_tokens():
    expl, gen = _explanation(), _generation()
    for html in (expl.to_html(), expl._repr_html_(), gen.to_html(), gen._repr_html_()):
        _no_markup(html)
        assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_tooltips_read_the_decoded_token_and_keep_the_raw_one():
    html = _explanation()._repr_html_()
    titles = re.findall(r'title="([^"]*)"', html)
    assert titles[4].startswith("␣&lt;/: ")  # " </" -- the space its Ġ stands for, visible
    assert titles[0].startswith("he: ") and titles[1].startswith("␣wrote: ")
    assert not any("Ġ" in title for title in titles)
    assert re.findall(r'data-token="([^"]*)"', html)[4] == "Ġ&lt;/"


def test_the_generation_views_data_cannot_close_or_reopen_its_script_element():
    gen = _generation()
    for html in (gen.to_html(), gen._repr_html_()):
        start = html.index('<script type="application/json">') + len('<script type="application/json">')
        payload = html[start : html.index("</script>", start)]
        assert "<" not in payload and ">" not in payload and "&" not in payload
        data = json.loads(payload)
        assert len(data["steps"]) == gen.steps and "<!--<script>" in data["steps"][3]
