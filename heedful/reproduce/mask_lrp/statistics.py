"""Mask-LRP report, statistics: per-example values, intervals and paired differences read from the
runs, ranks, concordance and the verdicts of the claims."""

from __future__ import annotations

import math

import numpy as np

from heedful.reproduce.mask_lrp.run import CORRUPTION_RATES, _corrupted_label, _DatasetRun
from heedful.reproduce.toolkit import spearman


# ---------------------------------------------------------------------------- numbers
def _ours(run: _DatasetRun, method: str, metric: str) -> tuple[float, float | None]:
    """(value, std over seeds or None) of one of our rows (a method or a Mask-LRP variant)."""
    if method in run.variants:
        return run.variants[method].mean(metric), run.variants[method].std(metric)
    group = run.result.groups.get(method)
    if group is None:
        return float("nan"), None
    summary = group.summaries[metric]
    return summary.value, (summary.std if group.seeds > 1 else None)


def _values(run: _DatasetRun, method: str, metric: str) -> np.ndarray | None:
    """Per-example values ``[n]`` of a method or variant (seeded ones: the mean over seeds)."""
    if method in run.variants:
        return run.variants[method].values[metric]
    return run.values.get(method, {}).get(metric)


def _interval(run: _DatasetRun, method: str, metric: str) -> tuple[float, float, float]:
    """Mean over the examples and its 95 % bootstrap interval (1000 resamples)."""
    from heedful.evaluate.intervals import bootstrap_mean

    vals = _values(run, method, metric)
    if vals is None:
        group = run.result.groups.get(method)
        if group is None:
            return (float("nan"),) * 3
        s = group.summaries[metric]
        return s.value, s.low, s.high
    return bootstrap_mean(vals[np.isfinite(vals)])


def _difference(run: _DatasetRun, a: str, b: str, metric: str) -> tuple[float, float, float]:
    """Mean per-example difference ``a - b`` and its 95 % paired bootstrap interval."""
    from heedful.evaluate.intervals import bootstrap_paired_difference

    va, vb = _values(run, a, metric), _values(run, b, metric)
    if va is None or vb is None:
        return (float("nan"),) * 3
    return bootstrap_paired_difference(va, vb)


def _excludes_zero(value: tuple[float, float, float]) -> bool:
    return math.isfinite(value[1]) and (value[1] > 0 or value[2] < 0)


def _standard_error(run: _DatasetRun, method: str, metric: str) -> float:
    """Standard error over examples of a method's mean metric."""
    summary = run.result.groups[method].summaries[metric]
    return summary.std / math.sqrt(summary.n) if summary.n else float("nan")


def _curve(run: _DatasetRun, method: str, metric: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    if method in run.variants:
        return run.variants[method].curve(metric)
    group = run.result.groups.get(method)
    if group is None or group.summaries[metric].curve is None:
        return None, None
    return np.asarray(group.summaries[metric].curve, dtype=float), group.curve_std.get(metric)


def _cost(run: _DatasetRun, method: str) -> dict[str, float]:
    if method in run.variants:
        return run.variants[method].cost
    return run.result.groups[method].cost


def _ranks(values: dict[str, float], higher_better: bool) -> dict[str, int]:
    """Competition ranks (1 = best); values equal to three decimals share a rank."""
    finite = {k: round(v if higher_better else -v, 3) for k, v in values.items() if math.isfinite(v)}
    return {k: 1 + sum(other > v for other in finite.values()) for k, v in finite.items()}


def _concordance(a: dict[str, float], b: dict[str, float]) -> tuple[int, int]:
    """Method pairs ordered the same way by ``a`` and ``b`` (ties count as disagreement), of all pairs."""
    keys = [k for k in a if k in b and math.isfinite(a[k]) and math.isfinite(b[k])]
    same = total = 0
    for i, p in enumerate(keys):
        for q in keys[i + 1 :]:
            total += 1
            same += (a[p] - a[q]) * (b[p] - b[q]) > 0
    return same, total


def _corruption_points(run: _DatasetRun, metric: str) -> list[tuple[float, tuple[float, float, float]]]:
    """Figure 4: ``(rate, (mean, low, high))`` from the selected mask (0) through the corrupted
    masks to every head (1, ``chefer``); per-example values averaged over the seeds."""
    points = [(0.0, _interval(run, "mask_lrp", metric))]
    points += [(r, _interval(run, _corrupted_label(r), metric)) for r in CORRUPTION_RATES if _corrupted_label(r) in run.variants]
    if "chefer" in run.values:
        points.append((1.0, _interval(run, "chefer", metric)))
    return points


def _verdict(run: _DatasetRun, a: str, b: str) -> tuple[str, tuple, tuple]:
    """Whether ``a`` beats ``b`` on both metrics by the 95 % intervals of the paired differences."""
    da, dl = _difference(run, a, b, "aopc"), _difference(run, a, b, "log_odds")
    better = da[1] > 0 and dl[2] < 0
    worse = da[2] < 0 and dl[1] > 0
    if better:
        text = "better on both metrics (both intervals exclude 0)"
    elif worse:
        text = "worse on both metrics (both intervals exclude 0)"
    elif not _excludes_zero(da) and not _excludes_zero(dl):
        text = "no difference (both intervals include 0)"
    else:
        text = "mixed: " + ", ".join(
            f"{name} {'better' if (d[1] > 0 if name == 'AOPC' else d[2] < 0) else 'worse' if _excludes_zero(d) else 'no difference'}"
            for name, d in (("AOPC", da), ("LOdds", dl))
        )
    return text, da, dl


def _corruption_trend(run: _DatasetRun) -> tuple[float, float]:
    """Spearman rho of the mean AOPC and of the mean LOdds against the corruption rate."""
    rates = [r for r, _ in _corruption_points(run, "aopc")]
    return tuple(spearman(rates, [v[0] for _, v in _corruption_points(run, m)]) for m in ("aopc", "log_odds"))
