"""What every reproduction report shares: the verdict vocabulary and the functions that decide a
claim's verdict from 95 % intervals, interval text, Spearman correlation.

A claim "A is ahead of B" gets one of five verdicts (:data:`VERDICTS`):

- **holds**: the intervals are apart, in the claimed direction;
- **not separated**: the intervals overlap (the claimed direction or not: the data do not tell
  A from B at this sample size; an estimate on the wrong side of 0 is said in brackets);
- **does not hold**: the intervals are apart, in the wrong direction;
- **not comparable**: our number and the paper's measure different things (another population,
  error set or protocol; the caller says which);
- **cannot be tested here**: something the test needs is missing (the caller says what).

Where A and B are scored on the same examples the interval is of their paired difference
(:func:`paired_verdict`, :func:`~heedful.evaluate.intervals.bootstrap_paired_difference`),
not two marginal intervals: the examples' shared difficulty cancels in the difference.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from heedful.evaluate.intervals import bootstrap_mean, bootstrap_paired_difference

HOLDS = "holds"
NOT_SEPARATED = "not separated"
DOES_NOT_HOLD = "does not hold"
NOT_COMPARABLE = "not comparable"
CANNOT_BE_TESTED = "cannot be tested here"
VERDICTS = (HOLDS, NOT_SEPARATED, DOES_NOT_HOLD, NOT_COMPARABLE, CANNOT_BE_TESTED)

WRONG_DIRECTION = "wrong direction"

LEGEND = (
    "Verdicts: **holds** -- 95 % intervals apart, in the claimed direction; **not separated** -- the intervals "
    "overlap (\"wrong direction\" when the point estimate is on the other side); **does not hold** -- intervals apart, "
    "in the wrong direction; **not comparable** -- our number measures another population, error set or protocol "
    "than the paper's (said in the row); **cannot be tested here** -- what the test needs is missing (said in the row). "
    "Where two methods are scored on the same examples the interval is of their paired difference (bootstrap over "
    "examples, 1000 resamples)."
)
"""The legend every claims table prints above itself."""

Interval = tuple[float, float, float]
"""(estimate, low, high) of a 95 % interval."""


@dataclass(frozen=True)
class Verdict:
    """A verdict word of :data:`VERDICTS` and, where there is one, why (what is not comparable or
    missing; ``wrong direction`` for a not-separated claim whose estimate points the other way).
    ``str()`` gives ``word (reason)``."""

    word: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.word not in VERDICTS:
            raise ValueError(f"unknown verdict {self.word!r}; one of {', '.join(VERDICTS)}")

    def __str__(self) -> str:
        return f"{self.word} ({self.reason})" if self.reason else self.word


def _guard(not_comparable: str | None, missing: str | None) -> Verdict | None:
    if missing:
        return Verdict(CANNOT_BE_TESTED, missing)
    if not_comparable:
        return Verdict(NOT_COMPARABLE, not_comparable)
    return None


def difference_verdict(difference: Interval, higher_is_better: bool = True, *, not_comparable: str | None = None,
                       missing: str | None = None) -> Verdict:
    """The claim "A is ahead of B" from the interval of the difference A − B (ahead = above 0 when
    ``higher_is_better``, below 0 otherwise). ``not_comparable``: why our A − B is not the paper's
    (another population, error set or protocol); ``missing``: what the test lacks. A non-finite
    interval cannot test anything."""
    guard = _guard(not_comparable, missing)
    if guard is not None:
        return guard
    estimate, low, high = difference
    if not all(math.isfinite(v) for v in (estimate, low, high)):
        return Verdict(CANNOT_BE_TESTED, "no interval")
    sign = 1.0 if higher_is_better else -1.0
    low, high = sorted((sign * low, sign * high))
    if low > 0:
        return Verdict(HOLDS)
    if high < 0:
        return Verdict(DOES_NOT_HOLD)
    return Verdict(NOT_SEPARATED, WRONG_DIRECTION if sign * estimate < 0 else "")


def interval_verdict(a: Interval, b: Interval, higher_is_better: bool = True, *, not_comparable: str | None = None,
                     missing: str | None = None) -> Verdict:
    """The claim "A is ahead of B" from two intervals of different examples (populations that
    cannot be paired): apart when they do not overlap. Scored on the same examples, use
    :func:`paired_verdict` instead."""
    guard = _guard(not_comparable, missing)
    if guard is not None:
        return guard
    if not all(math.isfinite(v) for v in (*a, *b)):
        return Verdict(CANNOT_BE_TESTED, "no interval")
    sign = 1.0 if higher_is_better else -1.0
    behind = sign * (a[0] - b[0]) < 0
    a_low, a_high = sorted((sign * a[1], sign * a[2]))
    b_low, b_high = sorted((sign * b[1], sign * b[2]))
    if a_low > b_high:
        return Verdict(HOLDS)
    if a_high < b_low:
        return Verdict(DOES_NOT_HOLD)
    return Verdict(NOT_SEPARATED, WRONG_DIRECTION if behind else "")


def paired_verdict(a: np.ndarray, b: np.ndarray, higher_is_better: bool = True, *, not_comparable: str | None = None,
                   missing: str | None = None) -> tuple[Verdict, Interval]:
    """The claim "A is ahead of B" for two methods scored on the same examples: per-example
    values ``a``, ``b`` ``[n]`` (aligned by example) -> the verdict from the 95 % paired
    bootstrap interval of A − B, and that interval."""
    difference = bootstrap_paired_difference(a, b)
    return difference_verdict(difference, higher_is_better, not_comparable=not_comparable, missing=missing), difference


def summary_verdict(a: Any, b: Any, higher_is_better: bool = True, difference: Interval | None = None, *,
                    not_comparable: str | None = None, missing: str | None = None) -> Verdict:
    """The claim "A is ahead of B" for two bench summaries (``value``, ``low``, ``high``): from the
    95 % paired interval of A − B where there is one (the two scored on the same examples,
    :func:`bench_difference`), else from the two marginal intervals."""
    if difference is not None and all(math.isfinite(v) for v in difference):
        return difference_verdict(difference, higher_is_better, not_comparable=not_comparable, missing=missing)
    return interval_verdict((a.value, a.low, a.high), (b.value, b.low, b.high), higher_is_better,
                            not_comparable=not_comparable, missing=missing)


def threshold_verdict(value: Interval, threshold: float, above: bool = True, *, not_comparable: str | None = None,
                      missing: str | None = None) -> Verdict:
    """The claim "the quantity is above ``threshold``" (below it with ``above=False``) from the
    quantity's 95 % interval ``value``: holds when the interval lies on the claimed side, does not
    hold when it lies on the other, not separated when it contains the threshold."""
    shifted = (value[0] - threshold, value[1] - threshold, value[2] - threshold)
    return difference_verdict(shifted, above, not_comparable=not_comparable, missing=missing)


def equivalence_verdict(difference: Interval, margin: float, *, not_comparable: str | None = None,
                        missing: str | None = None) -> Verdict:
    """The claim "A and B barely differ" (by less than ``margin``) from the 95 % interval of
    A − B: holds when the interval lies within ``(-margin, margin)``, does not hold when it lies
    wholly outside it (beyond ``margin`` on one side), not separated otherwise."""
    guard = _guard(not_comparable, missing)
    if guard is not None:
        return guard
    estimate, low, high = difference
    if not all(math.isfinite(v) for v in (estimate, low, high, margin)):
        return Verdict(CANNOT_BE_TESTED, "no interval")
    if -margin < low and high < margin:
        return Verdict(HOLDS)
    if low >= margin or high <= -margin:
        return Verdict(DOES_NOT_HOLD)
    return Verdict(NOT_SEPARATED)


def count_verdict(separated: int, ahead: int, total: int, share: float = 0.8, *, not_comparable: str | None = None,
                  missing: str | None = None) -> Verdict:
    """A claim over several places ("ahead at almost all layers"; tested as at least ``share`` of
    ``total``): holds when the places with intervals apart in the claimed direction (``separated``)
    reach that share, not separated when only the point estimates' direction (``ahead``) does,
    does not hold otherwise."""
    guard = _guard(not_comparable, missing)
    if guard is not None:
        return guard
    if total < 1:
        return Verdict(CANNOT_BE_TESTED, "nothing to count")
    if separated >= share * total:
        return Verdict(HOLDS)
    return Verdict(NOT_SEPARATED) if ahead >= share * total else Verdict(DOES_NOT_HOLD)


def exact_verdict(true: bool, *, not_comparable: str | None = None, missing: str | None = None) -> Verdict:
    """A claim about a quantity measured without sampling error here (a count of passes, a
    property of one fixed mask or one generated text, a measured cost ratio): holds or does not
    hold. A quantity averaged over examples takes an interval verdict instead."""
    guard = _guard(not_comparable, missing)
    if guard is not None:
        return guard
    return Verdict(HOLDS if true else DOES_NOT_HOLD)


def untestable(missing: str) -> Verdict:
    """*cannot be tested here*, with what is missing."""
    return Verdict(CANNOT_BE_TESTED, missing)


def all_of(verdicts: Iterable[Verdict]) -> Verdict:
    """A claim made of parts that must all hold (e.g. "better on both metrics"): the first part
    that cannot be tested or is not comparable decides; else does not hold if any part does
    not, holds if all do, not separated otherwise."""
    found = list(verdicts)
    for word in (CANNOT_BE_TESTED, NOT_COMPARABLE, DOES_NOT_HOLD):
        hit = next((v for v in found if v.word == word), None)
        if hit is not None:
            return hit
    if found and all(v.word == HOLDS for v in found):
        return Verdict(HOLDS)
    if not found:
        return Verdict(CANNOT_BE_TESTED, "nothing to test")
    wrong = any(v.reason == WRONG_DIRECTION for v in found)
    return Verdict(NOT_SEPARATED, WRONG_DIRECTION if wrong else "")


# ---------------------------------------------------------------------------- report options
def option_list(value: Any, default: Iterable[str] = ()) -> list[str]:
    """A report option that names several things (``--option methods=a,b`` or a list): its
    stripped, non-empty items; ``default`` when the option is absent (None)."""
    if value is None:
        return list(default)
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    return [str(x).strip() for x in items if str(x).strip()]


def count_option(options: Mapping[str, Any], key: str, default: int, minimum: int = 1) -> int:
    """Report option ``key`` as a whole number of at least ``minimum`` (``default`` when absent);
    an InputError naming the option otherwise."""
    from heedful.errors import InputError

    value = str(options.get(key, default)).strip()
    if not value.isdigit() or int(value) < minimum:
        what = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"
        raise InputError(f"{key} must be {what}, got {value!r}", hint=f"e.g. {key}={default}")
    return int(value)


# ---------------------------------------------------------------------------- coverage
COVERAGE = ("reproduced", "analogue", "not reproduced")
"""How a report covers each experiment, table and figure of its paper: run as the paper ran it,
run on an analogue (other models, data or protocol; the row says which), or not run (the row says
why)."""


def coverage_section(entries: Iterable[tuple[str, str, str]], heading: str = "## The paper's experiments here") -> list[str]:
    """Markdown: every experiment, table and figure of the paper (``entries``: what, status, how or
    why not), each with a status of :data:`COVERAGE` (a bracketed qualifier may follow it)."""
    rows = list(entries)
    for what, status, _ in rows:
        if not any(status == word or status.startswith(word + " (") for word in COVERAGE):
            raise ValueError(f"coverage of {what!r}: {status!r} is not one of {', '.join(COVERAGE)}")
    lines = [heading, "", "| experiment | here | how, or why not |", "|---|---|---|"]
    return lines + [f"| {what} | {status} | {how} |" for what, status, how in rows] + [""]


# ---------------------------------------------------------------------------- numbers as text
def interval_text(estimate: float, low: float, high: float, digits: int = 3, sign: bool = False,
                  std: float | None = None) -> str:
    """``0.812 [0.780, 0.844]`` (``+``-signed with ``sign``; ``0.812 ± 0.004 [...]`` with a
    finite ``std`` over seeds); the estimate alone when the interval is not finite; ``–`` when
    the estimate is not.

    An interval bound that is not 0 but would print as 0 gets more digits (up to six), so that
    the side of 0 a verdict reads from it shows:

    >>> interval_text(0.0004, 0.0001, 0.0007, sign=True)
    '+0.0004 [+0.0001, +0.0007]'
    """
    if estimate is None or not math.isfinite(estimate):
        return "–"
    bounds = [b for b in (low, high) if math.isfinite(b) and b != 0]
    while digits < 6 and any(round(b, digits) == 0 for b in bounds):
        digits += 1
    f = f"+.{digits}f" if sign else f".{digits}f"
    text = f"{estimate:{f}}" + (f" ± {std:.{digits}f}" if std is not None and math.isfinite(std) else "")
    if not (math.isfinite(low) and math.isfinite(high)):
        return text
    return f"{text} [{low:{f}}, {high:{f}}]"


def summary_text(summary: Any, seeds: int = 1, digits: int = 3) -> str:
    """:func:`interval_text` of a bench summary (``value``, ``low``, ``high``, ``std``), with the
    std over seeds when the method ran with more than one seed."""
    return interval_text(summary.value, summary.low, summary.high, digits, std=summary.std if seeds > 1 else None)


def mean_interval(values: Iterable[float | None]) -> tuple[float, float, float, int]:
    """Mean, 95 % bootstrap interval and count of the finite ``values`` (NaN bounds for one
    value; all NaN and count 0 for none)."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if arr.size == 0:
        return (math.nan, math.nan, math.nan, 0)
    if arr.size == 1:
        return (float(arr[0]), math.nan, math.nan, 1)
    mean, low, high = bootstrap_mean(arr)
    return (mean, low, high, int(arr.size))


def values_text(values: Iterable[float | None], digits: int = 3) -> str:
    """``0.81 [0.78, 0.84]``: the finite ``values``' mean and 95 % bootstrap interval
    (:func:`mean_interval`, :func:`interval_text`)."""
    return interval_text(*mean_interval(values)[:3], digits)


def spearman(a: Sequence[float] | np.ndarray | Mapping[Any, float], b: Sequence[float] | np.ndarray | Mapping[Any, float],
             minimum: int = 2) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (aligned ``[n]``, or two mappings aligned on
    the keys both hold with finite values); NaN with fewer than ``minimum`` values or when either
    side is constant."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys = [k for k in a if k in b and math.isfinite(a[k]) and math.isfinite(b[k])]
        a, b = [a[k] for k in keys], [b[k] for k in keys]
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < max(2, minimum) or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


# ---------------------------------------------------------------------------- paired bench rows
def bench_difference(result: Any, a: str, b: str, metric: str) -> Interval:
    """The difference A − B of two method groups of one bench ``result``
    (:class:`~heedful.evaluate.bench.BenchResult`) on ``metric`` with its 95 % paired bootstrap
    interval, from the per-example values in the results store (a seeded method: the mean over
    its seeds per example). A mean metric: :func:`~heedful.evaluate.intervals.bootstrap_paired_difference`;
    a metric computed over the examples (Pearson): the difference on each of its resamples,
    which line up across methods. NaNs when the store does not hold both rows."""
    from heedful.evaluate.bench import per_example_from_store
    from heedful.evaluate.intervals import percentile_interval
    from heedful.evaluate.metrics import METRICS
    from heedful.evaluate.store import ResultsStore

    nothing = (math.nan, math.nan, math.nan)
    runs = {g: [r for r in result.runs if r.group == g] for g in (a, b)}
    if not result.ids or not runs[a] or not runs[b]:
        return nothing
    protocol, spec = result.spec.protocol, METRICS[metric]
    with ResultsStore(result.store_path) as store:
        per = {g: [per_example_from_store(store, r.key, metric, protocol.hash(), result.ids) for r in rs]
               for g, rs in runs.items()}
    if spec.resamples is not None:
        boots = {g: [spec.resamples(p, protocol) for p in ps] for g, ps in per.items()}
        if any(x.size == 0 for bs in boots.values() for x in bs):
            return nothing
        low, high = percentile_interval(np.mean(boots[a], axis=0) - np.mean(boots[b], axis=0))
        return (result.groups[a].summaries[metric].value - result.groups[b].summaries[metric].value, low, high)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = {g: np.nanmean([p.values for p in ps], axis=0) for g, ps in per.items()}
    return bootstrap_paired_difference(means[a], means[b])


def bench_curve_differences(result: Any, a: str, b: str, metric: str) -> np.ndarray:
    """``[R, 3]``: the difference A − B of two method groups' perturbation curves at each of the
    ``R`` points of ``metric``'s curve (e.g. the removal ratios of AOPC), with its 95 % paired
    bootstrap interval over the examples (seeded methods: the mean over seeds per example); an
    empty array when the store holds no curves of both."""
    from heedful.evaluate.bench import per_example_from_store
    from heedful.evaluate.store import ResultsStore

    runs = {g: [r for r in result.runs if r.group == g] for g in (a, b)}
    if not result.ids or not runs[a] or not runs[b]:
        return np.empty((0, 3))
    phash = result.spec.protocol.hash()
    with ResultsStore(result.store_path) as store:
        curves = {g: [per_example_from_store(store, r.key, metric, phash, result.ids).curves for r in rs]
                  for g, rs in runs.items()}
    if any(c is None for cs in curves.values() for c in cs):
        return np.empty((0, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = {g: np.nanmean(np.stack(cs), axis=0) for g, cs in curves.items()}  # [n, R]
    width = min(mean[a].shape[1], mean[b].shape[1])
    return np.array([bootstrap_paired_difference(mean[a][:, j], mean[b][:, j]) for j in range(width)])
