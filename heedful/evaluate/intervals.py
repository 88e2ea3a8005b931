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
