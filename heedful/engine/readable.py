"""Tokens as people read them: each token decoded alone by its tokenizer (byte-level BPE's ``Ġ`` /
``Ċ`` and SentencePiece's ``▁`` become real spaces and line breaks), on one line, with visible
marks where a token would otherwise be blank or break the line:

- a line break is ``⏎`` (``\\r\\n`` one ``⏎``), a tab ``⇥``, wherever they occur;
- a token made only of whitespace shows each space as ``␣`` (``" "`` -> ``␣``, ``"\\n  "`` ->
  ``⏎␣␣``); spaces next to visible text stay spaces (``" Paris"``).

Every view meant for people (headers, ``Explanation.tokens``, ``top()``, ``words()``,
``generated_tokens``, the terminal and HTML views, JSON, pandas) shows tokens this way; the
tokenizer's own symbols stay in ``raw_tokens``.

>>> marked(" Paris"), marked("\\n"), marked("  "), marked(".\\n\\n"), marked("\\n  ")
(' Paris', '⏎', '␣␣', '.⏎⏎', '⏎␣␣')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NEWLINE = "⏎"
TAB = "⇥"
SPACE = "␣"
SENTENCEPIECE_SPACE = "▁"

_LINES = str.maketrans({"\n": NEWLINE, "\r": NEWLINE, "\v": NEWLINE, "\f": NEWLINE, "\x85": NEWLINE,
                        "\u2028": NEWLINE, "\u2029": NEWLINE, "\t": TAB})


def marked(text: str) -> str:
    """``text`` on one line with its invisible characters marked (see the module docstring)."""
    shown = text.replace("\r\n", "\n").translate(_LINES)
    if text and text.isspace():
        shown = "".join(SPACE if c.isspace() else c for c in shown)
    return shown


def readable_tokens(tokenizer: Any, ids: Sequence[int], raw: Sequence[str]) -> list[str]:
    """Each token of ``ids`` (whose tokenizer symbols are ``raw``) as people read it: decoded
    alone (special tokens kept as they are written), marked with :func:`marked`; a token that
    decodes to nothing keeps its raw symbol, so that no token is blank."""
    decoded = tokenizer.batch_decode([[int(i)] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    found = []
    for symbol, text in zip(raw, decoded, strict=True):
        if symbol.startswith(SENTENCEPIECE_SPACE) and not text[:1].isspace():
            text = " " + text  # a SentencePiece decoder drops the space a decoded sequence starts with
        found.append(marked(text) if text else symbol)
    return found
