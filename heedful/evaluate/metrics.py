"""The metrics: per-example values (and per-ratio or per-layer curves) and how they aggregate.

Faithfulness metrics are all read off three kinds of raw measurements, so that asking for one
more metric never costs another forward pass over data already measured:

* ``remove`` curve -- outputs with the top-ranked tokens removed at each ratio
  (:func:`heedful.evaluate.perturbation.curve`): AOPC / comprehensiveness, log-odds, accuracy
  (drop), Pearson (drop), deletion area;
* ``keep`` curve -- outputs with only the top-ranked tokens kept: sufficiency, insertion area;
* ``loo`` -- leave-one-out drops: tau-LOO;
* ``soft`` -- outputs with every token's embedding dimensions dropped in proportion to its
  normalised score (:mod:`heedful.evaluate.soft`): soft comprehensiveness and sufficiency.

Plausibility metrics compare scores with evidence and need no forward pass.

=================  ====  ===================================================================
metric             best  definition (source)
=================  ====  ===================================================================
aopc               high  ``mean_k [f(x) - f(x \\ top_k)]`` over the protocol's ratios (Samek et
                         al. 2017; ERASER comprehensiveness; NormXLogit Eq. 10; Mask-LRP Eq. 12)
comprehensiveness  high  alias of aopc (ferret's ``aopc_compr``)
sufficiency        low   ``mean_k [f(x) - f(top_k only)]`` (DeYoung et al. 2020; ferret)
log_odds           low   ``mean_k log(p(x \\ top_k) / p(x))`` (Mask-LRP Eq. 13; Shrikumar et al.)
accuracy           low   accuracy of the predictions on perturbed inputs against the gold
                         label (the original prediction when there is none), mean over k
                         (NormXLogit §4.1 "Accuracy")
accuracy_drop      high  ``acc(x) - acc(x \\ top_k)``, mean over k
pearson            low   Pearson r between perturbed regression outputs and gold values, mean
                         over k (NormXLogit §4.1, STS-B)
pearson_drop       high  ``r(x) - r(x \\ top_k)``, mean over k
deletion           low   area under the watched output as top tokens are removed, over the
                         ratio span (Petsiuk et al. 2018, RISE §4.1, for text)
insertion          high  area under the output as only the top tokens are kept
soft_compre-      high  ``max(0, p(x) - p(x_C))``, ``x_C`` each embedding dimension of token
hensiveness              ``i`` kept with probability ``1 - s_i`` (Zhao & Aletras 2023, Eq. 2)
soft_sufficiency   high  ``1 - max(0, p(x) - p(x_S))``, kept with probability ``s_i`` (Zhao &
                         Aletras 2023, Eq. 3)
tau_loo            high  Kendall tau-b between leave-one-out drops and scores (ferret; Jain &
                         Wallace 2019)
dot_product        high  ``E . norm(S)``: score mass on the evidence (NormXLogit §5.1, after
                         Yin & Neubig 2022)
average_precision  high  ``sum_k (R_k - R_{k-1}) P_k`` of the ranking against the evidence
                         (NormXLogit Eq. 11)
auprc              high  area under the precision-recall curve (ERASER; ferret)
token_f1           high  F1 of the top-k hard rationale against the evidence (ERASER; ferret)
iou                high  |top-k AND evidence| / |top-k OR evidence| (ERASER; ferret)
=================  ====  ===================================================================

Context attribution adds a fourth kind of measurement, ``ablations`` (the target's
log-probability with the top-k sources removed and under random source ablations), and the
metrics ``source_top1``, ``source_top3``, ``precision_at_k``, ``source_comprehensiveness`` and
``lds``, registered by :mod:`heedful.evaluate.context`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from heedful.errors import InputError
from heedful.evaluate.intervals import bootstrap_indices, bootstrap_mean, percentile_interval
from heedful.evaluate.perturbation import Outputs
from heedful.evaluate.protocol import Protocol

if TYPE_CHECKING:
    from heedful.evaluate.context import SourceAblations


@dataclass
class Measurements:
    """Raw measurements of B examples, from which metrics are derived.

    ``x`` ``[R]`` curve ratios; ``original`` ``[B]``; ``remove`` / ``keep`` ``[B, R]`` with their
    ``*_valid`` masks; ``loo_drops`` per example (drops at the rankable positions, in position
    order) and ``loo_scores`` (the explanation's scores there); ``gold_class`` ``[B]`` (-1:
    unknown), ``gold_value`` ``[B]`` (NaN: unknown), ``kept`` ``[B]`` (examples not skipped by
    the protocol). Plausibility uses ``scores`` (per example
    ``[N]`` or ``[L, N]``), ``evidence`` and ``considered`` (``[N]`` bool each). Context
    attribution (:mod:`heedful.evaluate.context`) uses ``ablations`` (the source-ablation
    outputs), ``source_scores`` (per example ``[S]``, ``None`` without sources),
    ``answer_source`` ``[B]`` (-1: unknown) and ``content`` (per example ``[N]`` bool: the
    non-special tokens of the explained text).
    """

    protocol: Protocol
    n: int
    x: np.ndarray | None = None
    original: Outputs | None = None
    remove: Outputs | None = None
    remove_valid: np.ndarray | None = None
    keep: Outputs | None = None
    keep_valid: np.ndarray | None = None
    loo_drops: list[np.ndarray] | None = None
    loo_scores: list[np.ndarray] | None = None
    gold_class: np.ndarray | None = None
    gold_value: np.ndarray | None = None
    scores: list[np.ndarray] | None = None
    evidence: list[np.ndarray] | None = None
    considered: list[np.ndarray] | None = None
    kept: np.ndarray | None = None
    ablations: SourceAblations | None = None
    source_scores: list[np.ndarray | None] | None = None
    answer_source: np.ndarray | None = None
    content: list[np.ndarray] | None = None
    soft_erased: Outputs | None = None
    soft_kept: Outputs | None = None

    @property
    def kept_mask(self) -> np.ndarray:
        """``[B]`` examples the protocol evaluates (not skipped by ``min_length``)."""
        return np.ones(self.n, dtype=bool) if self.kept is None else self.kept


@dataclass
class PerExample:
    """A metric on B examples: ``values`` ``[B]`` (NaN: not defined for that example), optional
    ``curves`` ``[B, R]`` (per ratio) or ``[B, L]`` (per layer), optional ``extras`` per example."""

    values: np.ndarray
    curves: np.ndarray | None = None
    extras: list[dict] | None = None


@dataclass
class Summary:
    """A metric aggregated over examples: ``value``, its standard deviation over examples,
    ``n`` examples counted, the mean ``curve`` (``[R]`` or ``[L]``) if the metric has one, and
    ``low`` / ``high``: a 95 % bootstrap interval of ``value`` over examples where the metric's
    aggregation gives one (NaN otherwise)."""

    value: float
    std: float
    n: int
    curve: np.ndarray | None = None
    low: float = float("nan")
    high: float = float("nan")

    @property
    def has_interval(self) -> bool:
        return bool(np.isfinite(self.low) and np.isfinite(self.high))


@dataclass(frozen=True)
class Metric:
    """A registered metric. ``source``: ``"remove"``, ``"keep"``, ``"loo"``, ``"ablations"`` or
    ``"evidence"``; ``curve_kind``: ``"ratio"``, ``"layer"``, ``"sources"`` (per number of
    removed sources, ``protocol.source_ks``) or ``None``."""

    name: str
    family: str
    source: str
    higher_is_better: bool
    summary: str
    compute: Callable[[Measurements], PerExample] = field(repr=False)
    aggregate: Callable[[PerExample, Protocol], Summary] | None = field(default=None, repr=False)
    curve_kind: str | None = "ratio"
    needs_probability: bool = False
    needs_value: bool = False
    resamples: Callable[[PerExample, Protocol], np.ndarray] | None = field(default=None, repr=False)
    """For a metric that is not a mean over examples: its value on every bootstrap resample of the
    examples (the same resamples on every call), so a stochastic method's interval is that of the
    mean over its seeds."""


# ---------------------------------------------------------------------------- helpers
def _masked_mean(curves: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row means of ``curves`` ``[B, R]`` over ``mask`` ``[B, R]`` (NaN where a row has none)."""
    data = np.where(mask, curves, 0.0)
    count = mask.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, data.sum(axis=1) / np.maximum(count, 1), np.nan)


def _curve_mean(m: Measurements, curves: np.ndarray, valid: np.ndarray, empty: float | None = None) -> np.ndarray:
    mask = valid & m.protocol.mean_mask[None, :] & np.isfinite(curves)
    values = _masked_mean(curves, mask)
    if empty is not None:  # e.g. ferret: no ratio left a rationale -> its default score
        values = np.where(mask.any(axis=1) | ~m.kept_mask, values, empty)
    return values


def _require(value, name: str, metric: str):
    if value is None:
        raise InputError(f"{metric} needs the {name} measurement")
    return value


def _area(x: np.ndarray, y: np.ndarray, valid: np.ndarray, x0: float | None = None, y0: np.ndarray | None = None) -> np.ndarray:
    """Per-row trapezoid area of ``y`` ``[B, R]`` over ``x`` (valid points only), divided by the
    x span -- the plain AUC when the points span [0, 1]. ``(x0, y0)`` is a leading point."""
    out = np.full(y.shape[0], np.nan)
    for b in range(y.shape[0]):
        keep = valid[b] & np.isfinite(y[b])
        xs, ys = x[keep], y[b, keep]
        if x0 is not None and y0 is not None and np.isfinite(y0[b]):
            xs, ys = np.concatenate([[x0], xs]), np.concatenate([[y0[b]], ys])
        if len(xs) >= 2 and xs[-1] > xs[0]:
            out[b] = np.trapezoid(ys, xs) / (xs[-1] - xs[0])
        elif len(xs) == 1:
            out[b] = ys[0]
    return out


def _nanmean_std(values: np.ndarray) -> tuple[float, float, int]:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return float("nan"), float("nan"), 0
    return float(finite.mean()), float(finite.std(ddof=1)) if len(finite) > 1 else 0.0, int(len(finite))


def mean_aggregate(per: PerExample, protocol: Protocol) -> Summary:
    """Mean (and std) over examples of the per-example values, its 95 % percentile bootstrap
    interval (two examples or more), and the mean curve."""
    value, std, n = _nanmean_std(per.values)
    low = high = float("nan")
    if n > 1:
        _, low, high = bootstrap_mean(per.values[np.isfinite(per.values)])
    curve = None
    if per.curves is not None and per.curves.size:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            curve = np.nanmean(per.curves, axis=0)
    return Summary(value, std, n, curve, low, high)


# ---------------------------------------------------------------------------- faithfulness
def _comprehensiveness(m: Measurements) -> PerExample:
    remove, valid = _require(m.remove, "remove", "aopc"), m.remove_valid
    curves = np.where(valid, m.original.output[:, None] - remove.output, np.nan)
    empty = m.protocol.empty_rationale[0] if m.protocol.empty_rationale else None
    return PerExample(_curve_mean(m, curves, valid, empty), curves)


def _sufficiency(m: Measurements) -> PerExample:
    keep, valid = _require(m.keep, "keep", "sufficiency"), m.keep_valid
    curves = np.where(valid, m.original.output[:, None] - keep.output, np.nan)
    empty = m.protocol.empty_rationale[1] if m.protocol.empty_rationale else None
    return PerExample(_curve_mean(m, curves, valid, empty), curves)


def _log_odds(m: Measurements) -> PerExample:
    remove, valid = _require(m.remove, "remove", "log_odds"), m.remove_valid
    curves = np.where(valid, remove.log_probability - m.original.log_probability[:, None], np.nan)
    return PerExample(_curve_mean(m, curves, valid), curves)


def _references(m: Measurements) -> np.ndarray:
    """Gold class where known, else the original prediction."""
    gold = m.gold_class if m.gold_class is not None else np.full(m.n, -1)
    return np.where(gold >= 0, gold, m.original.predicted)


def _correct(m: Measurements) -> tuple[np.ndarray, np.ndarray]:
    remove, valid = _require(m.remove, "remove", "accuracy"), m.remove_valid
    ref = _references(m)
    curves = np.where(valid, (remove.predicted == ref[:, None]).astype(float), np.nan)
    original = (m.original.predicted == ref).astype(float)
    return curves, original


def _accuracy(m: Measurements) -> PerExample:
    curves, original = _correct(m)
    return PerExample(_curve_mean(m, curves, m.remove_valid), curves, [{"original": float(o)} for o in original])


def _accuracy_drop(m: Measurements) -> PerExample:
    curves, original = _correct(m)
    drops = original[:, None] - curves
    return PerExample(_curve_mean(m, drops, m.remove_valid), drops, [{"original": float(o)} for o in original])


def _regression_values(m: Measurements) -> PerExample:
    remove, valid = _require(m.remove, "remove", "pearson"), m.remove_valid
    gold = m.gold_value if m.gold_value is not None else np.full(m.n, np.nan)
    curves = np.where(valid, remove.output, np.nan)
    extras = [{"gold": float(g), "original": float(o)} for g, o in zip(gold, m.original.output, strict=True)]
    return PerExample(np.where(np.isfinite(gold), 0.0, np.nan), curves, extras)


def pearson_columns(curves: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Pearson r of every column of ``curves`` ``[..., B, R]`` with ``gold`` ``[..., B]`` over the
    examples where both are finite -> ``[..., R]`` (NaN with fewer than 3 such examples or no
    spread). Leading dimensions batch bootstrap resamples."""
    ok = np.isfinite(curves) & np.isfinite(gold)[..., None]
    count = ok.sum(axis=-2)
    y = np.where(ok, curves, 0.0)
    g = np.where(ok, gold[..., None], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        y_mean = y.sum(axis=-2) / count
        g_mean = g.sum(axis=-2) / count
        dy = np.where(ok, y - y_mean[..., None, :], 0.0)
        dg = np.where(ok, g - g_mean[..., None, :], 0.0)
        cov = (dy * dg).sum(axis=-2)
        sy, sg = np.sqrt((dy**2).sum(axis=-2)), np.sqrt((dg**2).sum(axis=-2))
        r = cov / (sy * sg)
    spread = (sy > 1e-12 * np.maximum(1.0, np.abs(y_mean))) & (sg > 0)
    return np.where((count >= 3) & spread, r, np.nan)


def _pearson_inputs(per: PerExample) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    gold = np.array([e["gold"] for e in per.extras or []], dtype=float)
    original = np.array([e["original"] for e in per.extras or []], dtype=float)
    curves = per.curves if per.curves is not None else np.zeros((len(gold), 0))
    return gold, original, curves


def _pearson_curve(per: PerExample) -> tuple[np.ndarray, float, int]:
    gold, original, curves = _pearson_inputs(per)
    r = pearson_columns(curves, gold)
    r0 = float(pearson_columns(original[:, None], gold)[0]) if len(gold) else float("nan")
    return r, r0, int(np.isfinite(gold).sum())


def _pearson_resamples(per: PerExample, protocol: Protocol, drop: bool) -> np.ndarray:
    """The Pearson metric recomputed on every bootstrap resample of the examples
    (:func:`~heedful.evaluate.intervals.bootstrap_indices`): r per ratio (or its drop), mean over
    the protocol's ratios -> ``[n_boot]`` (empty when undefined). Every call resamples alike, so
    the resamples of a stochastic method's seeds line up."""
    gold, original, curves = _pearson_inputs(per)
    r, r0, _ = _pearson_curve(per)
    mask = protocol.mean_mask & np.isfinite(r0 - r if drop else r)
    if not mask.any() or len(gold) < 3:
        return np.zeros(0)
    idx = bootstrap_indices(len(gold))
    boot = pearson_columns(curves[idx][..., mask], gold[idx])  # [n_boot, R kept]
    if drop:
        boot = pearson_columns(original[idx][..., None], gold[idx]) - boot
    return boot.mean(axis=-1)


def _pearson_summary(per: PerExample, protocol: Protocol, drop: bool) -> Summary:
    """Pearson r per ratio (or its drop from the unperturbed r) over examples, its mean over the
    protocol's ratios, and a 95 % percentile bootstrap interval of that mean from resampling the
    examples (:func:`_pearson_resamples`)."""
    r, r0, n = _pearson_curve(per)
    curve = r0 - r if drop else r
    mask = protocol.mean_mask & np.isfinite(curve)
    value = float(curve[mask].mean()) if mask.any() else float("nan")
    low, high = percentile_interval(_pearson_resamples(per, protocol, drop))
    return Summary(value, float("nan"), n, curve, low, high)


def _pearson_aggregate(per: PerExample, protocol: Protocol) -> Summary:
    return _pearson_summary(per, protocol, drop=False)


def _pearson_drop_aggregate(per: PerExample, protocol: Protocol) -> Summary:
    return _pearson_summary(per, protocol, drop=True)


def _deletion(m: Measurements) -> PerExample:
    remove, valid = _require(m.remove, "remove", "deletion"), m.remove_valid
    curves = np.where(valid, remove.output, np.nan)
    return PerExample(_area(m.x, curves, valid, 0.0, m.original.output), curves)


def _insertion(m: Measurements) -> PerExample:
    keep, valid = _require(m.keep, "keep", "insertion"), m.keep_valid
    curves = np.where(valid, keep.output, np.nan)
    return PerExample(_area(m.x, curves, valid), curves)


def _soft_drop(m: Measurements, outs: Outputs | None, metric: str) -> np.ndarray:
    """``max(0, p(x) - p(x'))`` ``[B]`` of the soft-perturbed copies ``outs`` (NaN: skipped example)."""
    outs = _require(outs, "soft", metric)
    drop = np.maximum(0.0, m.original.probability - outs.probability)
    return np.where(m.kept_mask, drop, np.nan)


def _soft_comprehensiveness(m: Measurements) -> PerExample:
    return PerExample(_soft_drop(m, m.soft_erased, "soft_comprehensiveness"))


def _soft_sufficiency(m: Measurements) -> PerExample:
    return PerExample(1.0 - _soft_drop(m, m.soft_kept, "soft_sufficiency"))


def _tau_loo(m: Measurements) -> PerExample:
    from scipy.stats import kendalltau

    drops = _require(m.loo_drops, "loo", "tau_loo")
    values = np.full(m.n, np.nan)
    for b, (d, s) in enumerate(zip(drops, m.loo_scores or [], strict=True)):
        ok = np.isfinite(d) & np.isfinite(s)
        if ok.sum() >= 2 and np.ptp(d[ok]) > 0 and np.ptp(s[ok]) > 0:
            values[b] = kendalltau(d[ok], s[ok]).statistic
    return PerExample(values)


# ---------------------------------------------------------------------------- plausibility
def _per_layer(m: Measurements, fn: Callable[[np.ndarray, np.ndarray], float]) -> PerExample:
    """Apply ``fn(scores [n], evidence [n]) -> float`` to each example (and each layer of
    layer-wise scores: the curve runs over layers, the value is the last layer's)."""
    scores = _require(m.scores, "scores", "plausibility")
    n_layers = max((s.shape[0] if s.ndim == 2 else 1) for s in scores) if scores else 1
    values = np.full(m.n, np.nan)
    curves = np.full((m.n, n_layers), np.nan) if n_layers > 1 else None
    for b, (s, ev, ok) in enumerate(zip(scores, m.evidence or [], m.considered or [], strict=True)):
        if not ev[ok].any():
            continue
        rows = s if s.ndim == 2 else s[None, :]
        found = [fn(row[ok], ev[ok]) for row in rows]
        values[b] = found[-1]
        if curves is not None:
            curves[b, : len(found)] = found
    return PerExample(values, curves)


def normalize_scores(scores: np.ndarray, how: str) -> np.ndarray:
    """Scores made comparable across examples: ``softmax``, ``l1`` (``|s| / sum |s|``) or ``none``
    (``[N]``, or ``[R, N]`` row by row)."""
    if how == "softmax":
        z = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return z / z.sum(axis=-1, keepdims=True)
    if how == "l1":
        total = np.abs(scores).sum(axis=-1, keepdims=True)
        return np.divide(np.abs(scores), total, out=np.zeros_like(scores, dtype=float), where=total > 0)
    return scores


def dot_product_score(scores: np.ndarray, evidence: np.ndarray, normalization: str = "softmax") -> float:
    """``E . norm(S)``: the normalised score mass that falls on evidence tokens."""
    return float(normalize_scores(np.asarray(scores, dtype=float), normalization)[evidence.astype(bool)].sum())


def average_precision_score(scores: np.ndarray, evidence: np.ndarray) -> float:
    """NormXLogit Eq. 11, ``sum_k (R_k - R_{k-1}) P_k`` over the descending ranking
    (equal to :func:`sklearn.metrics.average_precision_score` when no scores tie)."""
    from sklearn.metrics import average_precision_score as sk_ap

    return float(sk_ap(evidence.astype(int), scores))


def dot_product_rows(scores: np.ndarray, evidence: np.ndarray, normalization: str = "softmax") -> np.ndarray:
    """:func:`dot_product_score` of every row of ``scores`` ``[R, N]`` against one ``evidence`` ``[N]`` -> ``[R]``."""
    return normalize_scores(np.asarray(scores, dtype=float), normalization)[:, evidence.astype(bool)].sum(axis=-1)


def average_precision_rows(scores: np.ndarray, evidence: np.ndarray) -> np.ndarray:
    """:func:`average_precision_score` of every row of ``scores`` ``[R, N]`` against one
    ``evidence`` ``[N]`` -> ``[R]``, in one pass of array operations: ``sum_k (R_k - R_{k-1}) P_k``
    over the thresholds of each row's descending ranking, tied scores making one threshold (as
    sklearn's). NaN for evidence with no positive."""
    scores = np.asarray(scores, dtype=float)
    truth = evidence.astype(bool)
    positives = int(truth.sum())
    if positives == 0:
        return np.full(scores.shape[0], np.nan)
    order = np.argsort(-scores, axis=-1, kind="stable")
    ranked = np.take_along_axis(scores, order, axis=-1)
    hits = np.cumsum(truth[order], axis=-1)  # true positives down to each rank  [R, N]
    last = np.ones_like(ranked, dtype=bool)  # the last rank of each group of tied scores: a threshold
    last[:, :-1] = ranked[:, 1:] != ranked[:, :-1]
    at = np.where(last, hits, 0)
    before = np.zeros_like(at)
    before[:, 1:] = np.maximum.accumulate(at, axis=-1)[:, :-1]  # hits at the previous threshold
    precision = hits / np.arange(1, scores.shape[-1] + 1)
    return np.where(last, (hits - before) / positives * precision, 0.0).sum(axis=-1)


def auprc_score(scores: np.ndarray, evidence: np.ndarray, only_positive: bool = True) -> float:
    """ferret's AUPRC: ``auc(recall, precision)`` of ``precision_recall_curve`` (negative scores
    set to 0 under ``only_positive``)."""
    from sklearn.metrics import auc, precision_recall_curve

    s = np.where(scores > 0, scores, 0.0) if only_positive else scores
    precision, recall, _ = precision_recall_curve(evidence.astype(int), s)
    return float(auc(recall, precision))


def hard_rationale(scores: np.ndarray, k: int, only_positive: bool = True) -> np.ndarray:
    """``[n]`` bool: the top-``k`` scores (only positive ones under ``only_positive``)."""
    order = np.argsort(-scores, kind="stable")[:k]
    if only_positive:
        order = order[scores[order] > 0]
    chosen = np.zeros(len(scores), dtype=bool)
    chosen[order] = True
    return chosen


def token_f1_score(scores: np.ndarray, evidence: np.ndarray, k: int = 5, only_positive: bool = True) -> float:
    """F1 of the top-``k`` hard rationale against the evidence (0 for an empty rationale, as ferret)."""
    pred = hard_rationale(scores, k, only_positive)
    truth = evidence.astype(bool)
    tp = float((pred & truth).sum())
    if pred.sum() == 0 or tp == 0:
        return 0.0
    precision, recall = tp / pred.sum(), tp / truth.sum()
    return 2 * precision * recall / (precision + recall)


def iou_score(scores: np.ndarray, evidence: np.ndarray, k: int = 5, only_positive: bool = True) -> float:
    """Token IOU of the top-``k`` hard rationale with the evidence (ERASER; 0 when empty)."""
    pred = hard_rationale(scores, k, only_positive)
    truth = evidence.astype(bool)
    if pred.sum() == 0:
        return 0.0
    union = (pred | truth).sum()
    return float((pred & truth).sum() / union) if union else 0.0


def _plausibility(kind: str) -> Callable[[Measurements], PerExample]:
    def compute(m: Measurements) -> PerExample:
        p = m.protocol
        fns: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
            "dot_product": lambda s, e: dot_product_score(s, e, p.dot_normalization),
            "average_precision": average_precision_score,
            "auprc": lambda s, e: auprc_score(s, e, p.only_positive),
            "token_f1": lambda s, e: token_f1_score(s, e, p.rationale_k, p.only_positive),
            "iou": lambda s, e: iou_score(s, e, p.rationale_k, p.only_positive),
        }
        return _per_layer(m, fns[kind])

    return compute


# ---------------------------------------------------------------------------- registry
def _m(name, family, source, higher, summary, compute, **kw) -> Metric:
    return Metric(name, family, source, higher, summary, compute, **kw)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        _m("aopc", "faithfulness", "remove", True, "probability drop when the top tokens are removed", _comprehensiveness),
        _m("sufficiency", "faithfulness", "keep", False, "probability drop when only the top tokens are kept", _sufficiency),
        _m("log_odds", "faithfulness", "remove", False, "log(p(x without top) / p(x))", _log_odds, needs_probability=True),
        _m("accuracy", "faithfulness", "remove", False, "accuracy after removing the top tokens", _accuracy),
        _m("accuracy_drop", "faithfulness", "remove", True, "accuracy lost by removing the top tokens", _accuracy_drop),
        _m("pearson", "faithfulness", "remove", False, "Pearson r of perturbed regression outputs with gold values",
           _regression_values, aggregate=_pearson_aggregate, needs_value=True,
           resamples=lambda per, protocol: _pearson_resamples(per, protocol, drop=False)),
        _m("pearson_drop", "faithfulness", "remove", True, "Pearson r lost by removing the top tokens",
           _regression_values, aggregate=_pearson_drop_aggregate, needs_value=True,
           resamples=lambda per, protocol: _pearson_resamples(per, protocol, drop=True)),
        _m("deletion", "faithfulness", "remove", False, "area under the output as top tokens are removed", _deletion),
        _m("insertion", "faithfulness", "keep", True, "area under the output as top tokens are kept", _insertion),
        _m("tau_loo", "faithfulness", "loo", True, "Kendall tau of leave-one-out drops and scores", _tau_loo, curve_kind=None),
        _m("soft_comprehensiveness", "faithfulness", "soft", True,
           "probability drop when each token's embedding is erased in proportion to its score",
           _soft_comprehensiveness, curve_kind=None, needs_probability=True),
        _m("soft_sufficiency", "faithfulness", "soft", True,
           "1 - probability drop when each token's embedding is kept in proportion to its score",
           _soft_sufficiency, curve_kind=None, needs_probability=True),
        _m("dot_product", "plausibility", "evidence", True, "normalised score mass on the evidence",
           _plausibility("dot_product"), curve_kind="layer"),
        _m("average_precision", "plausibility", "evidence", True, "average precision of the ranking against the evidence",
           _plausibility("average_precision"), curve_kind="layer"),
        _m("auprc", "plausibility", "evidence", True, "area under the precision-recall curve", _plausibility("auprc"), curve_kind="layer"),
        _m("token_f1", "plausibility", "evidence", True, "F1 of the top-k rationale", _plausibility("token_f1"), curve_kind="layer"),
        _m("iou", "plausibility", "evidence", True, "IOU of the top-k rationale", _plausibility("iou"), curve_kind="layer"),
    )
}
ALIASES = {"comprehensiveness": "aopc", "aopc_compr": "aopc", "aopc_suff": "sufficiency", "lodds": "log_odds",
           "ap": "average_precision", "dot": "dot_product", "f1": "token_f1", "taucorr_loo": "tau_loo",
           "precision@k": "precision_at_k", "p@k": "precision_at_k", "top1": "source_top1", "top3": "source_top3"}


def register_metric(
    name: str,
    *,
    family: str,
    source: str,
    higher_is_better: bool,
    summary: str,
    curve_kind: str | None = "ratio",
    aggregate: Callable[[PerExample, Protocol], Summary] | None = None,
    needs_probability: bool = False,
    needs_value: bool = False,
) -> Callable[[Callable[[Measurements], PerExample]], Callable[[Measurements], PerExample]]:
    """Register ``compute(measurements) -> PerExample`` as the metric ``name`` (see
    :class:`Metric`); ``compute`` is returned unchanged. ``source`` names the raw measurements it
    reads (``"remove"``, ``"keep"``, ``"loo"``, ``"ablations"``) or ``"evidence"``, so that
    :func:`evaluate` and ``heedful bench`` measure them once for every metric that needs them.

    >>> @register_metric("top1_drop", family="faithfulness", source="remove", higher_is_better=True,
    ...                  summary="probability drop when the top token is removed", curve_kind=None)
    ... def top1_drop(m):
    ...     return PerExample(m.original.output - m.remove.output[:, 0])
    >>> "top1_drop" in METRICS
    True
    >>> del METRICS["top1_drop"]
    """
    if name in METRICS:
        raise ValueError(f"metric {name!r} registered twice")
    if source not in ("remove", "keep", "loo", "soft", "ablations", "evidence"):
        raise ValueError(f"metric {name!r}: source must be remove, keep, loo, soft, ablations or evidence, not {source!r}")

    def deco(compute: Callable[[Measurements], PerExample]) -> Callable[[Measurements], PerExample]:
        METRICS[name] = Metric(
            name, family, source, higher_is_better, summary, compute, aggregate, curve_kind, needs_probability, needs_value
        )
        return compute

    return deco


def get_metric(name: str) -> Metric:
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key) if key not in METRICS else key
    if key not in METRICS:
        raise InputError(f"unknown metric {name!r}", hint="metrics: " + ", ".join(METRICS))
    return METRICS[key]


def aggregate(metric: Metric, per: PerExample, protocol: Protocol) -> Summary:
    return (metric.aggregate or mean_aggregate)(per, protocol)


def metric_names(names: str | Sequence[str]) -> list[str]:
    """Canonical, de-duplicated metric names from ``"aopc,sufficiency"`` or a list."""
    items = names.split(",") if isinstance(names, str) else list(names)
    found: list[str] = []
    for item in items:
        if item.strip():
            name = get_metric(item).name
            if name not in found:
                found.append(name)
    if not found:
        raise InputError("no metric given", hint="metrics: " + ", ".join(METRICS))
    return found
