"""NormXLogit report, statistics: method orderings and their agreement with the paper's, per-layer
intervals and logit-lens summaries, and the verdicts the claims use."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


# ---------------------------------------------------------------------------- ordering
def ordering(values: dict[str, float], higher_is_better: bool) -> list[str]:
    """Methods from best to worst."""
    finite = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
    return sorted(finite, key=lambda k: -finite[k] if higher_is_better else finite[k])


def pair_agreement(ours: dict[str, float], paper: dict[str, float | None]) -> tuple[float, int, float]:
    """Share of method pairs ordered the same way by both, the number of pairs, Kendall's tau
    (methods without a paper value left out)."""
    common = [
        m for m in ours
        if paper.get(m) is not None and ours[m] is not None and math.isfinite(ours[m]) and math.isfinite(paper[m])
    ]
    same = total = 0
    for i, a in enumerate(common):
        for b in common[i + 1 :]:
            d_ours, d_paper = ours[a] - ours[b], paper[a] - paper[b]
            if d_ours == 0 or d_paper == 0:
                continue
            total += 1
            same += (d_ours > 0) == (d_paper > 0)
    tau = float("nan")
    if len(common) >= 3:
        from scipy.stats import kendalltau

        tau = float(kendalltau([ours[m] for m in common], [paper[m] for m in common]).statistic)
    return (same / total if total else float("nan")), total, tau


def verdict(share: float) -> str:
    if not math.isfinite(share):
        return "cannot be compared"
    if share == 1.0:
        return "agrees"
    if share >= 0.75:
        return "largely agrees"
    if share >= 0.5:
        return "partly agrees"
    return "disagrees"


def leader(decompx: float, normxlogit: float, higher_is_better: bool) -> str:
    """Which of DecompX and NormXLogit a metric value puts ahead."""
    better = decompx > normxlogit if higher_is_better else decompx < normxlogit
    return "DecompX" if better else "NormXLogit"


def better(a: Any, b: Any, higher_is_better: bool) -> tuple[bool, bool]:
    """Whether summary ``a`` is ahead of ``b``, and whether their 95 % intervals are separated."""
    from heedful.evaluate.report import overlapping

    ahead = a.value > b.value if higher_is_better else a.value < b.value
    separated = a.has_interval and b.has_interval and not overlapping({"a": (a.low, a.high), "b": (b.low, b.high)})
    return bool(ahead), bool(separated)


LENS_ROWS = ("correct", "kl", "log_rank", "top_first", "first_norm")
"""Per pair and layer: the final norm + unembedding of the layer's state at the anchor prefers the
target over the foil (1/0); KL(final || layer) in nats; log10(1 + rank of the target) among the
vocabulary; LogAt(target)'s top position is the first token (1/0); the first token's hidden-state
norm over the median norm of the other positions."""


def per_layer_intervals(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95 % bootstrap intervals of the mean over examples (NaNs left out) of ``values``
    ``[..., E]`` -> ``low``, ``high`` ``[...]``: each row's :func:`~heedful.evaluate.intervals.bootstrap_mean`
    of its finite values, the rows with the same finite examples resampled together (the same
    seeded resamples, so the same intervals as one row at a time)."""
    from heedful.evaluate.intervals import bootstrap_indices

    flat = values.reshape(-1, values.shape[-1]) if values.shape[-1] else np.empty((int(np.prod(values.shape[:-1])), 0))
    low, high = np.full(flat.shape[0], np.nan), np.full(flat.shape[0], np.nan)
    finite = np.isfinite(flat)
    patterns: dict[bytes, list[int]] = {}
    for i, row in enumerate(finite):
        if row.sum() > 1:
            patterns.setdefault(np.packbits(row).tobytes(), []).append(i)
    for rows in patterns.values():
        kept = flat[np.ix_(rows, np.flatnonzero(finite[rows[0]]))]  # [r, k]
        draws = bootstrap_indices(kept.shape[1])  # [n_boot, k]
        for start in range(0, len(rows), 8):  # [8, n_boot, k] at a time
            means = kept[start : start + 8][:, draws].mean(axis=-1)
            low[rows[start : start + 8]], high[rows[start : start + 8]] = np.percentile(means, [2.5, 97.5], axis=-1)
    return low.reshape(values.shape[:-1]), high.reshape(values.shape[:-1])


def lens_summary(lens: dict[str, list[np.ndarray]], evidence: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per layer means of :data:`LENS_ROWS` over the pairs with their 95 % intervals (``key``,
    ``key_low``, ``key_high``; the median for ``first_norm``), and ``evidence_first``."""
    found: dict[str, np.ndarray] = {}
    for key in LENS_ROWS:
        stack = np.stack(lens[key], axis=1)  # [L, E]
        found[key] = np.nanmedian(stack, axis=1) if key == "first_norm" else np.nanmean(stack, axis=1)
        if key != "first_norm":
            found[f"{key}_low"], found[f"{key}_high"] = per_layer_intervals(stack)
    found["evidence_first"] = np.array(float(np.mean([bool(e[0]) for e in evidence])) if evidence else np.nan)
    return found


def layers_ahead(al: Any, key: str = "ap") -> tuple[int, int]:
    """Layers where NormXLogit is ahead of every one of
    :data:`~heedful.reproduce.normxlogit.run.VERSUS` on ``key``: by the paired
    difference's estimate, and with its 95 % paired interval apart from 0 (the toolkit's *holds*).
    ``al``: an :class:`~heedful.reproduce.normxlogit.run.Alignment` with ``versus``."""
    from heedful.reproduce.toolkit import HOLDS, difference_verdict

    diffs = al.versus[key]  # [3, L, 3]
    ahead = int((diffs[:, :, 0] > 0).all(axis=0).sum())
    apart = sum(all(difference_verdict(tuple(d[k])).word == HOLDS for d in diffs) for k in range(al.layers))
    return ahead, int(apart)
