"""Lecture report, statistics: bootstrap intervals over texts for probes (per-layer accuracy,
selectivity, Tenney et al.'s expected layer and its paired difference between properties), the
causal traces summarised per site over prompts, and the counterfactual tests' confirmation
rates with paired differences against random rankings.

Probe items are words or edges of texts; the texts, not the items, are the independent units,
so every probe interval resamples texts (a cluster bootstrap: a text drawn twice counts all its
items twice). Two properties probed on the same texts share the resamples, so their
difference's interval is paired."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heedful.evaluate.intervals import (
    bootstrap_indices,
    bootstrap_paired_difference,
    percentile_interval,
    wilson,
)
from heedful.reproduce.toolkit import Interval, mean_interval

N_BOOT = 1000


def cell_text(text: str) -> str:
    """Generated text as one markdown table cell: line breaks and pipes made visible."""
    return " ".join(text.replace("|", "/").split())


# ------------------------------------------------------------------------------ probes
def text_weights(item_texts: Sequence[int], texts: Sequence[int], seed: int = 0) -> np.ndarray:
    """``[N_BOOT, n_items]``: how often each item's text is drawn in each resample of ``texts``
    (the test texts, resampled with replacement; the same draws for any property of them)."""
    texts = list(texts)
    draws = bootstrap_indices(len(texts), N_BOOT, seed)  # [R, T]
    counts = np.zeros((N_BOOT, len(texts)))
    np.add.at(counts, (np.arange(N_BOOT)[:, None], draws), 1.0)
    where = {t: i for i, t in enumerate(texts)}
    return counts[:, [where[t] for t in item_texts]]


def weighted_accuracy(hits: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``[R, Ls]``: the accuracy of each layer's probe (``hits`` ``[Ls, n]``) in each resample
    (``weights`` ``[R, n]``)."""
    return weights @ np.asarray(hits, dtype=float).T / np.maximum(weights.sum(axis=1, keepdims=True), 1e-12)


def expected_layers(layers: Sequence[int], cumulative: np.ndarray) -> np.ndarray:
    """Tenney et al.'s Eq. 4 on every row of cumulative accuracies ``[R, Ls]`` -> ``[R]`` (NaN
    where the differentials sum to zero); :func:`heedful.inside.probing.expected_from` row-wise."""
    deltas = np.diff(cumulative, axis=1)
    total = deltas.sum(axis=1)
    found = (deltas * np.asarray(layers[1:], dtype=float)).sum(axis=1) / np.where(np.abs(total) < 1e-12, np.nan, total)
    return found


@dataclass
class ProbeStats:
    """One model's probe of one property with 95 % intervals over texts: per layer ``accuracy``,
    ``control`` and ``selectivity`` ``[Ls, 3]`` (estimate, low, high); the ``expected`` layer;
    the best layer and the gain of its probe over the embeddings' (layer 0), paired; and the
    resampled expected layers (``draws``, for paired differences)."""

    model: str
    property: str
    layers: list[int]
    accuracy: np.ndarray
    control: np.ndarray
    selectivity: np.ndarray
    expected: Interval
    best: int
    gain: Interval
    best_selectivity: Interval
    majority: float
    items: int
    draws: np.ndarray


def _rows(values: np.ndarray, draws: np.ndarray) -> np.ndarray:
    return np.array([(v, *percentile_interval(draws[:, j])) for j, v in enumerate(values)])


def probe_stats(result: dict, texts: Sequence[int], seed: int = 0) -> ProbeStats:
    """:class:`ProbeStats` of a stored probe (``probe(..., per_item=True).to_dict()``), resampling
    ``texts`` (the test texts shared by the properties probed on them)."""
    per = result["per_item"]
    layers = [s["layer"] for s in result["scores"]]
    hits, control = np.asarray(per["hits"], dtype=float), np.asarray(per["control_hits"], dtype=float)
    weights = text_weights(per["text"], texts, seed)
    acc, ctl = weighted_accuracy(hits, weights), weighted_accuracy(control, weights)
    point_acc, point_ctl = hits.mean(axis=1), control.mean(axis=1)
    cumulative = np.asarray(per["cumulative_hits"], dtype=float)
    draws = expected_layers(layers, weighted_accuracy(cumulative, weights))
    point = expected_layers(layers, cumulative.mean(axis=1)[None])[0]
    best = int(np.argmax(point_acc))
    gain = acc[:, best] - acc[:, 0]
    sel = acc[:, best] - ctl[:, best]
    return ProbeStats(
        model=result["model"], property=result["property"], layers=layers,
        accuracy=_rows(point_acc, acc), control=_rows(point_ctl, ctl), selectivity=_rows(point_acc - point_ctl, acc - ctl),
        expected=(float(point), *percentile_interval(draws)), best=layers[best],
        gain=(float(point_acc[best] - point_acc[0]), *percentile_interval(gain)),
        best_selectivity=(float(point_acc[best] - point_ctl[best]), *percentile_interval(sel)),
        majority=float(result["majority"]), items=len(per["text"]), draws=draws,
    )


def expected_difference(later: ProbeStats, earlier: ProbeStats) -> Interval:
    """``E[later] - E[earlier]`` with its paired 95 % interval (both resampled on the same texts)."""
    diff = later.draws - earlier.draws
    return (later.expected[0] - earlier.expected[0], *percentile_interval(diff))


# ------------------------------------------------------------------------------ traces
SITES = ("last subject token", "last token")


def site_curves(trace: dict) -> dict[str, np.ndarray]:
    """The indirect effect ``[L]`` at the last corrupted (subject) token and at the last token
    of one stored trace."""
    effect = np.asarray(trace["effect"], dtype=float)
    return {"last subject token": effect[:, max(trace["corrupted"])], "last token": effect[:, -1]}


def layer_centre(curve: np.ndarray) -> float:
    """The effect-weighted mean layer of a curve ``[L]`` (negative effects count as 0; NaN when
    nothing is positive)."""
    weights = np.clip(curve, 0.0, None)
    total = weights.sum()
    return float((weights * np.arange(len(curve))).sum() / total) if total > 0 else math.nan


@dataclass
class TraceStats:
    """Over the traced prompts: per kind and site the per-prompt curves ``[P, L]`` and their
    mean with a 95 % interval per layer ``[L, 3]``; AtP's Spearman with the exact grid."""

    layers: int
    curves: dict[tuple[str, str], np.ndarray]
    means: dict[tuple[str, str], np.ndarray]
    spearman: dict[str, Interval]
    prompts: int


def trace_stats(traces: dict[str, list[dict]]) -> TraceStats:
    """``traces``: per kind, the stored traces of the same prompts, in the same order."""
    curves, means, spearman = {}, {}, {}
    layers = 0
    for kind, found in traces.items():
        per = [site_curves(t) for t in found]
        for site in SITES:
            stack = np.stack([p[site] for p in per]) if per else np.zeros((0, 0))
            layers = stack.shape[1] if stack.size else layers
            curves[(kind, site)] = stack
            means[(kind, site)] = np.array([mean_interval(stack[:, j])[:3] for j in range(stack.shape[1])]) if stack.size else np.zeros((0, 3))
        spearman[kind] = mean_interval([t["spearman"] for t in found])[:3]
    return TraceStats(layers, curves, means, spearman, len(next(iter(traces.values()), [])))


def band_difference(stats: TraceStats, site: str, a: str, b: str, layers: slice) -> Interval:
    """Mean over ``layers`` of kind ``a``'s effect minus kind ``b``'s at ``site``, per prompt,
    with its paired 95 % bootstrap interval over prompts."""
    x = stats.curves[(a, site)][:, layers].mean(axis=1)
    y = stats.curves[(b, site)][:, layers].mean(axis=1)
    return bootstrap_paired_difference(x, y)


def centre_difference(stats: TraceStats, first: tuple[str, str], second: tuple[str, str]) -> tuple[Interval, Interval, Interval]:
    """The effect-weighted mean layers of two (kind, site) curves per prompt, each with its
    interval, and their paired difference ``second - first``."""
    a = np.array([layer_centre(c) for c in stats.curves[first]])
    b = np.array([layer_centre(c) for c in stats.curves[second]])
    return mean_interval(a)[:3], mean_interval(b)[:3], bootstrap_paired_difference(b, a)


# ------------------------------------------------------------------------------ counterfactuals
def confirmation(hypotheses: list[dict], edit: str) -> tuple[float, float, float, int]:
    """Share of ``edit``'s hypotheses confirmed, its Wilson 95 % interval, and their count."""
    mine = [h for h in hypotheses if h["edit"] == edit]
    if not mine:
        return (math.nan, math.nan, math.nan, 0)
    hits = sum(bool(h["confirmed"]) for h in mine)
    low, high = wilson(hits, len(mine))
    return (hits / len(mine), max(low, 0.0), min(high, 1.0), len(mine))  # no -0.00 from rounding


def confirmed_by_text(hypotheses: list[dict], edit: str, texts: int) -> np.ndarray:
    """``[texts]``: 1 where the text's ``edit`` hypothesis was confirmed, 0 where not, NaN where
    the text allowed none."""
    found = np.full(texts, np.nan)
    for h in hypotheses:
        if h["edit"] == edit:
            found[h["index"]] = float(bool(h["confirmed"]))
    return found


def against_random(found: dict[str, dict], method: str, edit: str) -> Interval:
    """``method``'s confirmation minus random rankings', paired over the texts both tested."""
    texts = found[method]["texts"]
    return bootstrap_paired_difference(confirmed_by_text(found[method]["hypotheses"], edit, texts),
                                       confirmed_by_text(found["random"]["hypotheses"], edit, texts))


def overlapping(rates: dict[str, tuple[float, float, float, int]]) -> list[tuple[str, str]]:
    """Pairs of methods whose Wilson intervals overlap."""
    names = [m for m, r in rates.items() if r[3] > 0]
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if rates[a][1] <= rates[b][2] and rates[b][1] <= rates[a][2]]
