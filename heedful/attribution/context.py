"""Context attribution: which sources of a long text (sentences, paragraphs, token windows or
the user's spans -- :mod:`heedful.engine.sources`) produced the target.

Each method scores every source and gives each token its source's score shared evenly, so
``Explanation.source_scores()`` returns the source scores exactly and token views stay
comparable with the token methods. A source is removed by deleting its tokens (ContextCite and
AttriBoT remove the text); tokens outside every source (a question after the context, a chat
template) are never removed. Every removal runs batched, and for decoders from the key/value
cache of the unchanged prefix (:mod:`heedful.engine.reuse`).
"""

from __future__ import annotations

import itertools
import warnings
from typing import Annotated, Literal

import numpy as np
import torch

from heedful.engine.options import AT_LEAST_ONE, NON_NEGATIVE, OPEN_UNIT, RUNTIME, Range
from heedful.engine.perturb import removable_positions
from heedful.engine.problem import Problem
from heedful.engine.reuse import removal_scores
from heedful.engine.seeding import example_generators
from heedful.errors import InputError
from heedful.registry import register

SourceRemoval = Literal["delete", "auto", "mask", "pad", "unk"]
ContextOutput = Literal["log_prob", "logit_prob", "logit", "probability"]
AT_LEAST_TWO = Range(2)
ENUMERABLE = 16
"""Most sources whose every ablation ``ablations="all"`` enumerates (2^16 passes)."""


def _source_removals(problem: Problem, keep: torch.Tensor, example: torch.Tensor) -> torch.Tensor:
    """``[R, N]`` positions to remove for rows keeping sources ``keep`` ``[R, S]`` (bool) of
    examples ``example`` ``[R]``: the removable tokens of every source not kept."""
    ids = problem.source_map().ids[example]  # [R, N]: each token's source, -1 for none
    inside = ids >= 0
    dropped = inside & ~keep.gather(1, ids.clamp(min=0))  # no [R, S, N] tensor: 64 ablations of 188 sources x 4,096 tokens would take 49 MB each
    return dropped & removable_positions(problem.batch, problem.target)[example]


def _reference_output(problem: Problem, output: str) -> torch.Tensor:
    return problem.target.output(problem.reference.logits.detach(), output).float().cpu()


@register("source_loo", family="context", cost="1 + S forwards of the text after each source (decoders)", spans=True, needs_sources=True)
@torch.no_grad()
def source_loo(
    problem: Problem,
    *,
    output: ContextOutput = "log_prob",
    removal: SourceRemoval = "delete",
    kv_cache: Annotated[bool, RUNTIME] = True,
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Exact leave-one-source-out: the target's drop when each source alone is removed.

    ``LOO_s = f(C) - f(C \\ s)`` for every source ``s`` of the text, ``f`` the target's
    ``output`` (log-probability by default: a span's summed log-probability, a contrast's
    difference); each token gets ``LOO_s / |s|`` ``[B, N]``. ``kv_cache`` (decoders): each copy
    starts from the key/value cache of the text before its source, so removing a late source
    costs only the tokens after it -- the same scores (to float rounding) for less compute.

    Source: Liu et al. 2024, AttriBoT: A Bag of Tricks for Efficiently Approximating Leave-One-Out Context Attribution (Eq. 1, Sec. 3.1)
    """
    sources = problem.source_map()
    counts = sources.counts
    example = torch.arange(len(problem), device=counts.device).repeat_interleave(counts)
    which = torch.cat([torch.arange(int(n), device=counts.device) for n in counts]) if len(example) else torch.zeros(0, dtype=torch.long, device=counts.device)
    width = max(int(counts.max()), 1)
    keep = torch.ones(len(example), width, dtype=torch.bool, device=counts.device)
    keep[torch.arange(len(example), device=keep.device), which] = False
    remove = _source_removals(problem, keep, example)
    changed = removal_scores(problem, example, remove, output, removal=removal, reuse=kv_cache, rows=internal_batch_size)
    values = torch.zeros(len(problem), width, device=changed.device)
    values[example, which] = _reference_output(problem, output)[example] - changed
    return sources.spread(values)


def _ablation_masks(counts: list[int], n: int, keep: float, ablations: str, gens: list[torch.Generator]) -> list[torch.Tensor]:
    """Per example ``[n_b, S_b]`` keep-masks: ``n`` Bernoulli(``keep``) draws from the
    example's generator, or every one of the ``2^S_b`` masks (``ablations="all"``)."""
    masks = []
    for m, gen in zip(counts, gens, strict=True):
        if ablations == "all":
            if m > ENUMERABLE:
                raise InputError(
                    f"ablations='all' would run 2^{m} passes for {m} sources",
                    hint=f"use ablations='random' (n_ablations=64), or at most {ENUMERABLE} sources",
                )
            masks.append(torch.tensor(list(itertools.product([False, True], repeat=m)), dtype=torch.bool).view(-1, m))
        else:
            masks.append(torch.rand((n, m), generator=gen, device="cpu") < keep)
    return masks


def ablation_outputs(
    problem: Problem, masks: list[torch.Tensor], output: str, *, removal: str = "delete", rows: int | None = None
) -> torch.Tensor:
    """The target's ``output`` for every keep-mask of ``masks`` (per example ``[n_b, S_b]``,
    ``True``: the source stays) -> ``[sum_b n_b]``, example by example: each copy deletes the
    removable tokens of the sources its mask drops (batched, :func:`removal_scores`)."""
    width = max(max((m.shape[1] for m in masks), default=1), 1)
    example = torch.cat([torch.full((len(m),), b, dtype=torch.long, device=m.device) for b, m in enumerate(masks)])
    keep = torch.ones(len(example), width, dtype=torch.bool, device=example.device)
    offset = 0
    for m in masks:
        keep[offset : offset + len(m), : m.shape[1]] = m
        offset += len(m)
    remove = _source_removals(problem, keep, example)
    return removal_scores(problem, example, remove, output, removal=removal, rows=rows)


def fit_surrogate(masks: np.ndarray, outputs: np.ndarray, alpha: float, folds: int) -> tuple[np.ndarray, float, dict[str, float]]:
    """ContextCite's surrogate for one example: ``outputs`` ``[n]`` regressed on keep-masks
    ``[n, S]`` (standardised) by a Lasso of strength ``alpha`` (ordinary least squares at 0);
    the weights mapped back to the masks' scale ``[S]``, the intercept, and the fit quality
    from ``folds``-fold cross-validated predictions: held-out R^2 and LDS (their Spearman
    correlation with the true outputs)."""
    from sklearn.linear_model import Lasso, LinearRegression
    from sklearn.model_selection import KFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def model():
        regressor = LinearRegression() if alpha == 0 else Lasso(alpha=alpha, fit_intercept=True, random_state=0)
        return make_pipeline(StandardScaler(), regressor)

    fitted = model().fit(masks, outputs)
    scaler, regressor = fitted[0], fitted[1]
    weights = regressor.coef_ / scaler.scale_
    intercept = float(regressor.intercept_ - (weights * scaler.mean_).sum())
    quality = {"r2": float("nan"), "lds": float("nan")}
    if folds >= 2 and len(outputs) >= 2 * folds:
        held_out = cross_val_predict(model(), masks, outputs, cv=KFold(folds, shuffle=True, random_state=0))
        residual = ((outputs - held_out) ** 2).sum()
        total = ((outputs - outputs.mean()) ** 2).sum()
        quality["r2"] = float(1 - residual / total) if total > 0 else float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a constant output has no rank correlation: nan
            from scipy.stats import spearmanr  # on use: scipy.stats is slow to import

            quality["lds"] = float(spearmanr(held_out, outputs).statistic)
    return weights, intercept, quality


@register(
    "context_cite",
    family="context",
    cost="1 + n_ablations forwards",
    passes=lambda o, n: (1 + o["n_ablations"], 0),
    spans=True,
    needs_sources=True,
)
@torch.no_grad()
def context_cite(
    problem: Problem,
    *,
    n_ablations: Annotated[int, AT_LEAST_TWO] = 64,
    keep_probability: Annotated[float, OPEN_UNIT] = 0.5,
    alpha: Annotated[float, NON_NEGATIVE] = 0.01,
    output: ContextOutput = "logit_prob",
    ablations: Literal["random", "all"] = "random",
    folds: Annotated[int, NON_NEGATIVE] = 5,
    removal: SourceRemoval = "delete",
    seed: int = 0,
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """ContextCite: a sparse linear surrogate of the target over random source ablations.

    ``n_ablations`` copies keep each source with probability ``keep_probability``; the
    target's ``output`` of each (ContextCite's logit-probability ``log P - log(1 - P)`` of the
    target's joint probability by default), divided by its number of tokens, is regressed on
    the keep-masks with ``StandardScaler`` + ``Lasso(alpha)`` (least squares at ``alpha=0``);
    each source's weight (times the tokens again) is its score, shared evenly by its tokens
    ``[B, N]``. The fit's intercept and quality -- held-out R^2 and LDS (Spearman between
    ``folds``-fold cross-validated predictions and the true outputs) -- are in the
    explanation's ``details``. ``ablations="all"`` enumerates every mask instead (small ``S``).

    Source: Cohen-Wang et al. 2024, ContextCite: Attributing Model Generation to Context (Sec. 2.2-2.3, Eq. 2)
    """
    sources = problem.source_map()
    counts = sources.counts.tolist()
    width = max(max(counts, default=1), 1)
    masks = _ablation_masks(counts, n_ablations, keep_probability, ablations, example_generators(problem.batch, seed))
    outputs = ablation_outputs(problem, masks, output, removal=removal, rows=internal_batch_size)
    tokens = problem.target.classes.shape[1] if problem.target.is_span else 1
    values = torch.zeros(len(problem), width, device="cpu")  # filled from the numpy fits
    details: dict[str, list] = {"intercept": [], "r2": [], "lds": []}
    offset = 0
    for b, m in enumerate(masks):
        y = outputs[offset : offset + len(m)].double().numpy() / tokens
        offset += len(m)
        if m.shape[1] == 0:
            details["intercept"].append(float(y.mean()) * tokens)
            details["r2"].append(float("nan"))
            details["lds"].append(float("nan"))
            continue
        weights, intercept, quality = fit_surrogate(m.double().numpy(), y, alpha, folds)
        values[b, : m.shape[1]] = torch.from_numpy(weights * tokens).float()
        details["intercept"].append(intercept * tokens)
        details["r2"].append(quality["r2"])
        details["lds"].append(quality["lds"])
    problem.details.update(details)
    return sources.spread(values)
