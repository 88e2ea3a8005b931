"""Lexicon-derived token evidence for the sentiment snippet sets, and spans -> token positions.

The VADER snippet sets have no human rationales. What they do have is the VADER lexicon
(Hutto & Gilbert 2014, ``vader_lexicon.txt``): 7,500 words each rated by ten people on a
-4 .. +4 valence scale. A word of a snippet counts as **lexicon-derived evidence** when its mean
human valence has magnitude at least :data:`DEFAULT_THRESHOLD` (1.5, slightly below the median
magnitude of the lexicon, 1.6: "good" 1.9, "dull" -1.7, "charming" 2.8 pass; "well" 1.1,
"hard" -0.4 do not). This is evidence *about the words*, not a human judgement of what
mattered in this particular sentence; reports must name it lexicon-derived evidence.

Words are found as VADER itself reads them (``SentiText._strip_punc_if_word``): split on
whitespace, strip leading / trailing punctuation unless that leaves two characters or fewer
(then it is probably an emoticon such as ``:)`` and is looked up as is), look up lower-cased.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence

import numpy as np

from heedful.datasets.examples import Span

DEFAULT_THRESHOLD = 1.5
"""Minimum ``|mean valence|`` (VADER scale -4..4) for a lexicon word to count as evidence."""

_PUNCT = string.punctuation


def lexicon_matches(
    text: str, lexicon: Mapping[str, float], threshold: float = DEFAULT_THRESHOLD
) -> list[tuple[str, int, int, float]]:
    """Lexicon words of ``text`` with ``|valence| >= threshold``: ``(word, start, end, valence)``.

    >>> lexicon_matches("A charming, dull film :)", {"charming": 2.8, "dull": -1.7, ":)": 2.0})
    [('charming', 2, 10, 2.8), ('dull', 12, 16, -1.7), (':)', 22, 24, 2.0)]
    """
    found = []
    for match in re.finditer(r"\S+", text):
        raw = match.group()
        stripped = raw.strip(_PUNCT)
        if len(stripped) <= 2 or not stripped:
            word, start = raw, match.start()
        else:
            word, start = stripped, match.start() + raw.index(stripped)
        valence = lexicon.get(word.lower())
        if valence is None and word is not raw:
            word, start = raw, match.start()
            valence = lexicon.get(raw.lower())
        if valence is not None and abs(valence) >= threshold:
            found.append((word, start, start + len(word), float(valence)))
    return found


def lexicon_evidence(
    text: str, lexicon: Mapping[str, float], threshold: float = DEFAULT_THRESHOLD, segment: int = 0
) -> tuple[tuple[str, ...], tuple[Span, ...]]:
    """Evidence words of ``text`` and their ``(segment, start, end)`` spans."""
    matches = lexicon_matches(text, lexicon, threshold)
    return tuple(m[0] for m in matches), tuple((segment, m[1], m[2]) for m in matches)


def word_spans(text: str, words: Sequence[str], segment: int = 0) -> tuple[Span, ...]:
    """Spans of every whole-word, case-insensitive occurrence of each of ``words`` in ``text``."""
    spans: list[Span] = []
    for word in words:
        if not word:
            continue
        pattern = r"(?<!\w)" + re.escape(word) + r"(?!\w)"
        spans.extend((segment, m.start(), m.end()) for m in re.finditer(pattern, text, flags=re.IGNORECASE))
    return tuple(sorted(set(spans)))


def token_evidence(
    offsets: Sequence[tuple[int, int] | None],
    segments: Sequence[int | None],
    spans: Sequence[Span],
) -> np.ndarray:
    """``[N]`` bool: tokens whose character span overlaps an evidence span of the same segment.

    ``offsets`` / ``segments`` are an :class:`~heedful.Explanation`'s (or a
    :class:`~heedful.engine.batch.Batch` row's); special tokens (offset ``None``) are never evidence.
    """
    n = len(offsets)
    if n == 0 or not spans:
        return np.zeros(n, dtype=bool)
    starts = np.array([o[0] if o is not None else -1 for o in offsets])
    ends = np.array([o[1] if o is not None else -1 for o in offsets])
    segs = np.array([(s if s is not None else -1) if o is not None else -2 for o, s in zip(offsets, segments, strict=True)])
    span_arr = np.asarray(spans, dtype=np.int64).reshape(-1, 3)  # [S, 3]
    overlap = (
        (segs[:, None] == span_arr[None, :, 0])
        & (starts[:, None] < span_arr[None, :, 2])
        & (ends[:, None] > span_arr[None, :, 1])
        & (ends[:, None] > starts[:, None])
    )  # [N, S]
    return overlap.any(axis=1)
