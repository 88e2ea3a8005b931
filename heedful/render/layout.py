"""Lay an explanation out as display pieces: text fragments (token or word) with their scores,
and the untouched text between them, in reading order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # render reads explanations as plain data; heedful.explanation imports render
    from heedful.explanation import Explanation


VISIBLE = str.maketrans({" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍", "\u00a0": "⍽"})
"""Whitespace drawn as a sign, so a tooltip shows where a token's spaces and line breaks are."""


def reads_as(text: str) -> str:
    """What a stretch of text reads as in a tooltip: the characters themselves, whitespace
    visible (``" </"`` -> ``"␣</"``)."""
    return text.translate(VISIBLE)


@dataclass
class Piece:
    """A fragment to draw: ``score`` is ``None`` for plain text between scored pieces.
    ``title``: the tooltip (what the token reads as, and its score); ``token``: the tokenizer's
    own token (byte-level symbols and all), empty for words and plain text."""

    text: str
    score: float | None
    special: bool = False
    title: str = ""
    token: str = ""


SPACE_MARKERS = ("Ġ", "▁")
"""How byte-level BPE and SentencePiece tokens say they begin with a space."""


def _token_text(source: str, token: str, span: tuple[int, int]) -> str:
    """The stretch of ``source`` a token stands for: its offsets' text (decoded, unlike the raw
    token: ``Ġ</`` is `` </``), with the space its marker says it carries when the tokenizer
    trimmed that space from the offsets (``trim_offsets``)."""
    start, end = span
    if token[:1] in SPACE_MARKERS and start > 0 and source[start - 1].isspace() and not source[start:end][:1].isspace():
        start -= 1
    return source[start:end]


def pieces(expl: Explanation, words: bool = False, layer: int = -1, show_special: bool = True) -> list[Piece]:
    """Display pieces of ``expl``: each token (or word) with its score, and the original text
    between them, so that the heatmap reads like the input. ``layer`` picks a row of layer-wise
    scores."""
    scores = expl.scores[layer] if expl.layerwise else expl.scores
    out: list[Piece] = []
    if words:
        ws = expl.words("sum")
        row = ws.scores[layer] if ws.scores.ndim == 2 else ws.scores
        units = [
            (expl.segments[idx[0]], span, float(s), f"{w}: {s:+.4g}", "")
            for w, span, idx, s in zip(ws.words, ws.spans, ws.token_indices, row, strict=True)
        ]
        specials: list[tuple[int, str, float]] = []
    else:
        units = []
        specials = []
        for i, (tok, raw, off) in enumerate(zip(expl.tokens, expl.raw_tokens, expl.offsets, strict=True)):
            if off is None:
                specials.append((i, tok, float(scores[i])))
            else:  # the raw token says which space it carries; data-token keeps it
                reading = reads_as(_token_text(expl.source_text(expl.segments[i]), raw, off))
                units.append((expl.segments[i], off, float(scores[i]), f"{reading}: {scores[i]:+.4g}", raw))
    special_at = {i: (tok, s) for i, tok, s in specials}
    cursor: dict[int | None, int] = {0: 0, 1: 0}
    unit_iter = iter(units)
    # walk positions in order so special tokens appear where the tokenizer put them
    if words:
        sequence = [("unit", u) for u in units]
    else:
        sequence = []
        for i in range(len(expl.tokens)):
            sequence.append(("special", special_at[i]) if i in special_at else ("unit", next(unit_iter)))
    for kind, item in sequence:
        if kind == "special":
            if show_special:
                tok, s = item
                out.append(Piece(f" {tok} ", s, special=True, title=f"{tok}: {s:+.4g}", token=tok))
            continue
        segment, (start, end), s, title, token = item
        source = expl.source_text(segment)
        pos = cursor.get(segment, 0)
        if start > pos:
            out.append(Piece(source[pos:start], None))
        if end > start:
            out.append(Piece(source[start:end], s, title=title, token=token))
        cursor[segment] = max(pos, end)
    return out


def shown_label(label: str) -> str:
    """A target's label in a header: quoted when whitespace at its edges is part of it (the token
    ``" Paris"`` is not ``"Paris"``)."""
    return f'"{label}"' if label != label.strip() else label


def prediction_said(expl: Explanation) -> str:
    """What the model said about the explained output, for a header: its prediction and
    probability, a regression value, a span's log-probability (a span is given, not predicted:
    its probability is the product over its tokens) or a contrast of spans' difference; ``""``
    when the explanation records none."""
    pred = expl.prediction
    if "log_probability_difference" in pred:
        return f"log p difference {pred['log_probability_difference']:+.3f}"
    if "log_probability" in pred:
        return f"log p {pred['log_probability']:.3f} (p = {pred['probability']:.3g})"
    if "probability" in pred:
        return f"predicted {shown_label(str(pred['label']))} ({pred['probability']:.2f})"
    if "value" in pred:
        return f"predicted value {pred['value']:.3f}"
    return ""
