"""95 % percentile bootstrap intervals of a mean over examples -- the interval every comparison
of methods in heedful reports."""

from __future__ import annotations

import math

import numpy as np


def bootstrap_mean(values: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """The mean of ``values`` and its 95 % percentile bootstrap interval (``n_boot`` resamples
    from a seeded generator).

    >>> bootstrap_mean(np.array([1.0, 2.0, 3.0, 4.0]))[0]
    2.5
    """
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return (math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def bootstrap_indices(n: int, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """``[n_boot, n]`` resampled example indices from the seeded generator
    :func:`bootstrap_mean` uses (the same resamples, so intervals of one run line up)."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def percentile_interval(statistics: np.ndarray) -> tuple[float, float]:
    """The 95 % percentile interval of bootstrap ``statistics`` ``[n_boot]`` (NaNs left out;
    NaN when none is finite)."""
    finite = np.asarray(statistics, dtype=float)
    finite = finite[np.isfinite(finite)]
    if not finite.size:
        return (math.nan, math.nan)
    low, high = np.percentile(finite, [2.5, 97.5])
    return float(low), float(high)


def bootstrap_paired_difference(a: np.ndarray, b: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """The mean per-example difference ``a - b`` of two methods scored on the same examples and
    its 95 % percentile bootstrap interval: each resample draws examples (the same ones for both
    methods, from :func:`bootstrap_indices`), so the interval is of the paired difference, not
    of two marginal means. ``a``, ``b``: ``[n]`` aligned by example; pairs with a non-finite
    side are left out.

    >>> bootstrap_paired_difference(np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 2.0]))
    (1.0, 1.0, 1.0)
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values differ in shape: {a.shape} vs {b.shape}")
    keep = np.isfinite(a) & np.isfinite(b)
    return bootstrap_mean(a[keep] - b[keep], n_boot=n_boot, seed=seed)


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion ``successes / n`` (Wilson 1927; NaNs for
    ``n = 0``): ``(p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)``.

    >>> [round(v, 3) for v in wilson(8, 10)]
    [0.49, 0.943]
    """
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return ((centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n))
