"""One colour scale for every renderer: diverging for signed scores, sequential otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

POSITIVE = (214, 96, 77)  # warm: pushes towards the explained output
NEGATIVE = (67, 147, 195)  # cool: pushes against it
BLANK = (255, 255, 255)


def scaled_positions(special: Sequence[bool], sinks: bool = True) -> list[bool]:
    """Which positions set a view's colour scale: every one but the special tokens and, with
    ``sinks`` (the views' default), the first token -- where a decoder's first token soaks up
    attention and relevance (an attention sink; Xiao et al. 2024), its score would otherwise
    wash out every other colour. Left out of the scale only: the token is still coloured (at
    full strength when above the scale) and the stored scores are unchanged. The first token
    counts when nothing else would."""
    include = [not s for s in special]
    if sinks and len(include) > 1 and any(include[1:]):
        include[0] = False
    return include


@dataclass(frozen=True)
class Scale:
    """Maps a score to a colour: ``|score| / limit`` blends white towards warm or cool."""

    limit: float
    signed: bool

    @classmethod
    def fit(cls, scores: np.ndarray, include: Sequence[bool] | None = None) -> Scale:
        """Scale from the scores of the positions in ``include`` (all when ``None``)."""
        values = np.asarray(scores, dtype=float)
        if include is not None:
            mask = np.asarray(include, dtype=bool)
            values = values[..., mask]
        values = values[np.isfinite(values)]
        if values.size == 0:
            return cls(1.0, False)
        limit = float(np.abs(values).max()) or 1.0
        return cls(limit, bool((values < 0).any()))

    def intensity(self, score: float) -> float:
        return float(min(1.0, abs(score) / self.limit)) if np.isfinite(score) else 0.0

    def rgb(self, score: float) -> tuple[int, int, int]:
        t = self.intensity(score)
        end = NEGATIVE if score < 0 else POSITIVE
        return tuple(round(b + (e - b) * t) for b, e in zip(BLANK, end, strict=True))

    def text_rgb(self, score: float) -> tuple[int, int, int]:
        """Black on light backgrounds, white on saturated ones."""
        return (255, 255, 255) if self.intensity(score) > 0.65 else (0, 0, 0)
