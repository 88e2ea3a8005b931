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

from heedful.attribution.gradient import gradient_reference
from heedful.engine.options import AT_LEAST_ONE, NON_NEGATIVE, OPEN_UNIT, RUNTIME, Range
from heedful.engine.perturb import removable_positions
from heedful.engine.problem import Problem
from heedful.engine.reuse import removal_scores
from heedful.engine.seeding import example_generators
from heedful.errors import InputError
from heedful.registry import find, register

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


Coarse = Literal["saliency", "grad_x_input", "raw_attention", "source_loo", "context_cite"]
COARSE_SHARE = 0.5
"""Largest magnitude of a source ``hierarchical`` did not refine, as a share of the smallest
magnitude among those it refined: every refined source outranks every other by its magnitude."""


def _below_refined(pooled: torch.Tensor, refined: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Source scores ``[B, S]``: the exact scores ``exact`` where ``refined`` (bool ``[B, S]``),
    elsewhere the coarse scores ``pooled`` scaled so that the largest magnitude among them is
    :data:`COARSE_SHARE` times the smallest refined magnitude of the example (their order
    kept, 0 when the example refined none or all of its refined scores are 0)."""
    inf = torch.full_like(exact, torch.inf)
    floor = torch.where(refined, exact.abs(), inf).amin(dim=1, keepdim=True)  # [B, 1]
    floor = torch.where(torch.isfinite(floor), floor, torch.zeros_like(floor))
    rest = torch.where(refined, torch.zeros_like(pooled), pooled)
    top = rest.abs().amax(dim=1, keepdim=True)
    scale = torch.where(top > 0, COARSE_SHARE * floor / top.clamp(min=torch.finfo(top.dtype).tiny), torch.zeros_like(top))
    return torch.where(refined, exact, rest * scale)


@register(
    "hierarchical",
    family="context",
    cost="the coarse method (saliency: 1 forward + 1 backward) + 1 forward up to the last kept source (the cache) + per kept source a forward of the text after it (decoders)",
    spans=True,
    needs_sources=True,
    version=3,
    reference=gradient_reference,  # the default coarse method's backward runs through it: no second forward
)
@torch.no_grad()
def hierarchical(
    problem: Problem,
    *,
    coarse: Coarse = "saliency",
    keep: Annotated[int, AT_LEAST_ONE] = 2,
    output: ContextOutput = "log_prob",
    removal: SourceRemoval = "delete",
    kv_cache: Annotated[bool, RUNTIME] = True,
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Hierarchical attribution: rank the sources with a cheap method, then leave out only the
    ``keep`` best of them, exactly.

    The ``coarse`` method's token scores summed per source rank the sources; the ``keep`` best
    (ties at the cut kept) get exact leave-one-source-out, ``LOO_s = f(C) - f(C \\ s)`` with
    ``f`` the target's ``output`` (as :func:`source_loo`), each copy continuing the key/value
    cache of the text before its source (decoders, ``kv_cache``), so a kept source costs only
    the tokens after it. Every other source keeps its coarse score, scaled so that its
    magnitude is at most :data:`COARSE_SHARE` of the smallest refined magnitude -- below every
    refined source, in the coarse order; each token gets its source's score over the source's
    tokens ``[B, N]``. The coarse source scores and the refined sources are in the explanation's
    ``details``.

    What it approximates: exact leave-one-source-out (:func:`source_loo`), which costs one pass
    over the text after every source (about ``S N / 2`` positions for ``S`` sources of an
    ``N``-token text); this costs a forward and a backward (saliency), one forward for the cache
    and at most ``keep N`` positions. The kept sources' scores equal exact LOO to float
    rounding; the ranking agrees with exact LOO's at the top wherever LOO's top source is among
    the coarse top ``keep`` -- the ranks below are the coarse method's, not LOO's.

    The default coarse method is ``saliency`` (gradient norms summed per source). On the
    planted long documents with ``smollm2-135m`` (``benchmarks/results/hierarchical_coarse.md``:
    12 documents at each of 512, 1,024 and 2,048 tokens) it ranked the planted source first in
    35 of 36 and never below second -- hence ``keep=2`` -- while ``grad_x_input``'s signed sums
    ranked it first in 26 and once 95th of 96, and ``raw_attention`` kept it in the top 3 in none. Version 3 refines whole
    sources with the cache (version 2 left out each token of the kept sources, without the
    cache, and scored every other token 0: slower than exact LOO over all sources).

    Source: Liu et al. 2024, AttriBoT: A Bag of Tricks for Efficiently Approximating Leave-One-Out Context Attribution (Sec. 3.1 cache reuse, Sec. 3.3 hierarchical attribution: exact LOO only where a cheap estimate ranks first)
    """
    sources = problem.source_map()
    info = find(coarse, problem.adapter.task)
    if problem.target.is_span and not info.spans:
        raise InputError(f"the coarse method {coarse} explains one position, and the target is a span", hint="use coarse='grad_x_input'")
    with torch.enable_grad():
        token_scores = info.fn(problem, **info.defaults).detach().float().cpu()
    problem.release_graph()
    if token_scores.dim() == 3:
        token_scores = token_scores[:, -1]
    pooled = sources.pool(token_scores)  # [B, S]
    counts = sources.counts.cpu()
    valid = torch.arange(pooled.shape[1], device=pooled.device)[None, :] < counts[:, None]
    ranked = torch.where(valid, pooled, torch.full_like(pooled, -torch.inf))
    k = min(keep, pooled.shape[1])
    cutoff = ranked.topk(k, dim=1).values[:, -1:]
    kept = valid & (ranked >= cutoff)  # [B, S]
    example, which = kept.nonzero(as_tuple=True)
    device = sources.counts.device
    example, which = example.to(device), which.to(device)
    keep_rows = torch.ones(len(example), pooled.shape[1], dtype=torch.bool, device=device)
    keep_rows[torch.arange(len(example), device=device), which] = False
    remove = _source_removals(problem, keep_rows, example)
    changed = removal_scores(problem, example, remove, output, removal=removal, reuse=kv_cache, rows=internal_batch_size)
    exact = torch.zeros_like(pooled)
    exact[example.cpu(), which.cpu()] = _reference_output(problem, output)[example.cpu()] - changed
    values = _below_refined(torch.where(valid, pooled, torch.zeros_like(pooled)), kept, exact)
    problem.details.update(
        {
            "coarse_source_scores": [row[: int(n)].tolist() for row, n in zip(pooled, counts, strict=True)],
            "kept_sources": [torch.nonzero(row).flatten().tolist() for row in kept],
        }
    )
    return sources.spread(values.to(device))
