"""Surrogate-model methods: LIME and KernelSHAP, with every perturbed forward batched.

Both fit a weighted linear model ``g(z) = b + sum_m w_m z_m`` to the explained output on binary
samples ``z`` (1 = token kept) around the input, and report the coefficients ``w`` as token
scores. They differ in how samples are drawn and weighted:

- **LIME** (Ribeiro et al. 2016, Eq. 1-2; reference: the ``lime`` package's
  ``LimeTextExplainer``): samples near the input, weighted by the exponential kernel
  ``pi(z) = exp(-d(z)^2 / (2 w^2))`` on the cosine distance ``d(z) = 1 - cos(z, 1)`` to the
  unperturbed input, and a ridge fit.
- **KernelSHAP** (Lundberg & Lee 2017, Theorem 2): coalition sizes ``k`` drawn with probability
  proportional to the Shapley kernel ``(M - 1) / (k (M - k))``, members uniformly, unit weights,
  and the empty and full coalitions with a very large weight (10^6) so that the fit nearly
  satisfies ``sum_m w_m = f(x) - f(empty)``; ordinary least squares.

Both are configured as Captum's ``Lime`` / ``KernelShap`` can be (``tests`` check agreement on
the same samples) but fit every example's model at once as one batched least-squares solve.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from heedful.attribution._masks import Features, features_of, score_samples, to_tokens
from heedful.attribution._precision import SampledPrecision
from heedful.attribution.perturbation import Output
from heedful.engine.options import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, RUNTIME, Range
from heedful.engine.perturb import Removal
from heedful.engine.precision import forward_precision
from heedful.engine.problem import Problem
from heedful.engine.seeding import example_generators
from heedful.errors import InputError
from heedful.registry import register

Sampling = Literal["lime", "bernoulli"]
AT_LEAST_TWO = Range(2)
SHAP_INFINITE_WEIGHT = 1e6
"""Weight of the empty and full coalitions (Captum's ``KernelShap.inf_weight``)."""


# ---------------------------------------------------------------------------------- sampling
def lime_samples(features: Features, n_samples: int, sampling: str, gens: list[torch.Generator]) -> torch.Tensor:
    """Keep-masks ``[B, S, M]`` (bool; padding features False).

    ``"lime"`` (``LimeTextExplainer``): the first sample is the input itself; each other sample
    removes ``r ~ U{1..M}`` features chosen uniformly. ``"bernoulli"`` (Captum's
    ``default_perturb_func``): each feature kept with probability 0.5.
    """
    bsz, width = features.positions.shape
    keep = torch.zeros(bsz, n_samples, width, dtype=torch.bool, device=features.valid.device)
    for b, (g, m) in enumerate(zip(gens, features.counts.tolist(), strict=True)):
        if m == 0:
            continue
        if sampling == "bernoulli":
            keep[b, :, :m] = torch.rand((n_samples, m), generator=g) < 0.5
            continue
        removed = torch.randint(1, m + 1, (n_samples,), generator=g, device="cpu")
        rank = torch.rand((n_samples, m), generator=g, device="cpu").argsort(dim=1).argsort(dim=1)
        keep[b, :, :m] = rank >= removed[:, None]  # the `removed` lowest-ranked go
        keep[b, 0, :m] = True
    return keep


def shap_samples(features: Features, n_samples: int, gens: list[torch.Generator]) -> torch.Tensor:
    """KernelSHAP keep-masks ``[B, S, M]``: the full and the empty coalition first, then
    coalitions of size ``k ~ (M - 1) / (k (M - k))`` (k = 1..M-1) with uniformly chosen members
    (Captum's ``kernel_shap_perturb_generator``)."""
    bsz, width = features.positions.shape
    keep = torch.zeros(bsz, n_samples, width, dtype=torch.bool, device=features.valid.device)
    for b, (g, m) in enumerate(zip(gens, features.counts.tolist(), strict=True)):
        if m == 0:
            continue
        if m == 1 or n_samples <= 2:  # only the two extremes exist (or fit)
            keep[b, 0::2, :m] = True
            continue
        sizes = torch.arange(1, m, dtype=torch.float64, device="cpu")
        probs = (m - 1) / (sizes * (m - sizes))
        k = torch.multinomial(probs, n_samples - 2, replacement=True, generator=g) + 1
        rank = torch.rand((n_samples - 2, m), generator=g, device="cpu").argsort(dim=1).argsort(dim=1)
        keep[b, 0, :m] = True
        keep[b, 2:, :m] = rank >= (m - k)[:, None]  # the k highest-ranked stay
    return keep


def lime_kernel(keep: torch.Tensor, counts: torch.Tensor, kernel_width: float) -> torch.Tensor:
    """``exp(-d^2 / (2 w^2))`` with ``d = 1 - cos(z, 1) = 1 - sqrt(|z| / M)`` ``[B, S]`` (Captum's
    ``get_exp_kernel_similarity_function`` on the interpretable sample; equal to the ``lime``
    package's ``sqrt(exp(-(100 d)^2 / 25^2))`` for ``w = 0.25``)."""
    if kernel_width <= 0:
        raise InputError(f"kernel_width must be positive, got {kernel_width}")
    kept = keep.sum(dim=2).double()
    m = counts.double().clamp_min(1)[:, None]
    distance = 1.0 - torch.sqrt(kept / m)
    return torch.exp(-(distance**2) / (2 * kernel_width**2))


# ---------------------------------------------------------------------------------- fitting
def weighted_linear_fit(
    x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, valid: torch.Tensor, alpha: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit ``y ~ b + x @ coef`` for every example at once, minimising
    ``sum_s w_s (y_s - b - x_s coef)^2 + alpha ||coef||^2`` (scikit-learn's ``Ridge`` /
    ``LinearRegression`` with ``sample_weight`` and an unpenalised intercept).

    ``x`` ``[B, S, M]``, ``y``/``w`` ``[B, S]``, ``valid`` ``[B, M]`` -> ``coef`` ``[B, M]`` (0 on
    invalid features), ``intercept`` ``[B]``. Solved in float64 by weighted centring and one
    batched least-squares call (minimum-norm solution when rank-deficient, as scipy's ``gelsd``).
    """
    x = x.double() * valid[:, None, :]
    y, w = y.double(), w.double()
    total = w.sum(dim=1, keepdim=True)
    x_mean = (w[..., None] * x).sum(dim=1, keepdim=True) / total[..., None]
    y_mean = (w * y).sum(dim=1, keepdim=True) / total
    root = w.sqrt()
    a = (x - x_mean) * root[..., None] * valid[:, None, :]
    rhs = (y - y_mean) * root
    if alpha > 0:
        eye = torch.diag_embed(valid.double()) * alpha**0.5
        a = torch.cat([a, eye], dim=1)
        rhs = torch.cat([rhs, torch.zeros(rhs.shape[0], eye.shape[1], dtype=rhs.dtype, device=rhs.device)], dim=1)
    coef = torch.linalg.lstsq(a, rhs[..., None], driver="gelsd").solution[..., 0] * valid
    intercept = y_mean[:, 0] - (x_mean[:, 0] * coef).sum(dim=1)
    return coef, intercept


# ---------------------------------------------------------------------------------- methods
@register("lime", family="perturbation", cost="n_samples forwards (batched)", passes=lambda o, n: (1 + o["n_samples"], 0))
def lime(
    problem: Problem,
    *,
    n_samples: Annotated[int, AT_LEAST_TWO] = 200,
    sampling: Sampling = "lime",
    kernel_width: Annotated[float, POSITIVE] = 0.25,
    alpha: Annotated[float, NON_NEGATIVE] = 1.0,
    removal: Removal = "auto",
    output: Output = "probability",
    seed: int | None = 0,
    precision: SampledPrecision = "fp32",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Weighted ridge fit of the output on random token removals near the input.

    LIME coefficients per removable token ``[B, N]`` (0 for special tokens and a fixed anchor).

    Defaults follow the ``lime`` package's text explainer: ``sampling="lime"`` (remove
    ``U{1..M}`` tokens; the first sample is the input), cosine kernel of width 0.25, ``Ridge(alpha=1)``
    with intercept, class probability as the output. Two departures from that explainer:
    ``n_samples`` 200 is ours (lime: 5000, Captum: 50), and the ridge is fitted on every
    removable token, where lime first keeps only ``num_features=10`` of them (its ``"auto"``
    feature selection) and fits those. Captum's ``Lime`` defaults differ (Bernoulli sampling -- ``sampling="bernoulli"``
    --, kernel on the model inputs, ``Lasso(alpha=0.01)``).

    Source: Ribeiro et al. 2016, "Why Should I Trust You?" (Eq. 1-2; LimeTextExplainer settings)
    """
    batch = problem.batch
    features = features_of(batch, problem.target)
    keep = lime_samples(features, n_samples, sampling, example_generators(batch, seed))
    with forward_precision(precision):
        y = score_samples(problem, features, keep, removal, output, internal_batch_size)
    w = lime_kernel(keep, features.counts, kernel_width)
    coef, _ = weighted_linear_fit(keep, y, w, features.valid, alpha)
    return to_tokens(features, coef.float(), batch.seq_len)


@register("kernel_shap", family="perturbation", cost="n_samples forwards (batched)", passes=lambda o, n: (1 + o["n_samples"], 0))
def kernel_shap(
    problem: Problem,
    *,
    n_samples: Annotated[int, AT_LEAST_TWO] = 200,
    removal: Removal = "auto",
    output: Output = "probability",
    seed: int | None = 0,
    precision: SampledPrecision = "fp32",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Shapley-kernel-weighted linear fit of the output on random token coalitions (approximate Shapley values).

    Approximate Shapley values per removable token ``[B, N]``.

    Sampling and weights as Captum's ``KernelShap`` (full and empty coalitions first with weight
    10^6, then Shapley-kernel-distributed coalition sizes with unit weight), ordinary least
    squares with intercept. Removed tokens become the ``removal`` token (``[MASK]``; deleted for
    causal LMs). ``n_samples`` 200 is ours (Captum: 25).

    Source: Lundberg & Lee 2017, A Unified Approach to Interpreting Model Predictions (Kernel SHAP,
    Theorem 2)
    """
    batch = problem.batch
    features = features_of(batch, problem.target)
    keep = shap_samples(features, n_samples, example_generators(batch, seed))
    with forward_precision(precision):
        y = score_samples(problem, features, keep, removal, output, internal_batch_size)
    full = keep.sum(dim=2)
    extreme = (full == 0) | (full == features.counts[:, None])
    w = torch.where(extreme, torch.full_like(y, SHAP_INFINITE_WEIGHT), torch.ones_like(y))
    coef, _ = weighted_linear_fit(keep, y, w, features.valid, 0.0)
    return to_tokens(features, coef.float(), batch.seq_len)
