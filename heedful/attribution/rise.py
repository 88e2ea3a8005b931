"""RISE for text: random binary keep-masks over tokens, importance = output-weighted mask mean."""

from __future__ import annotations

from typing import Annotated

import torch

from heedful.attribution._masks import Features, features_of, score_samples, to_tokens
from heedful.attribution._precision import SampledPrecision
from heedful.attribution.perturbation import Output
from heedful.engine.batch import Batch
from heedful.engine.options import AT_LEAST_ONE, OPEN_UNIT, RUNTIME
from heedful.engine.perturb import Removal
from heedful.engine.precision import forward_precision
from heedful.engine.problem import Problem
from heedful.engine.seeding import example_generators
from heedful.registry import register


def draw_masks(batch: Batch, features: Features, n_masks: int, p_keep: float, seed: int | None) -> torch.Tensor:
    """RISE's keep-masks ``[B, n_masks, M]`` (bool): each of example ``b``'s ``M_b`` features kept
    with probability ``p_keep``, from the example's own generator; ``False`` past ``M_b``."""
    keep = torch.zeros(len(batch), n_masks, features.width, dtype=torch.bool, device=features.valid.device)
    for b, (g, m) in enumerate(zip(example_generators(batch, seed), features.counts.tolist(), strict=True)):
        keep[b, :, :m] = torch.rand((n_masks, m), generator=g, device="cpu") < p_keep
    return keep


@register("rise", family="perturbation", cost="n_masks forwards (batched)", passes=lambda o, n: (1 + o["n_masks"], 0))
def rise(
    problem: Problem,
    *,
    n_masks: Annotated[int, AT_LEAST_ONE] = 500,
    p_keep: Annotated[float, OPEN_UNIT] = 0.5,
    removal: Removal = "auto",
    output: Output = "probability",
    seed: int | None = 0,
    precision: SampledPrecision = "fp32",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Mean output over random token keep-masks, weighted by whether each token was kept.

    ``S_j = 1 / (n_masks * p) * sum_m f(x . m_m) m_m[j]`` per removable token ``[B, N]``.

    Masks keep each removable token independently with probability ``p_keep`` (RISE's
    ``p = 0.5``); removed tokens become the ``removal`` token (deleted for causal LMs); special
    tokens are always kept and score 0. Token masks need no up-sampling (the image method's
    smooth masks have no text analogue). ``output``: class probability (RISE's choice) or logit.
    ``n_masks`` 500 is ours (the paper uses 4000-8000 for images with many more cells).

    Source: Petsiuk et al. 2018, RISE: Randomized Input Sampling for Explanation (Eq. 6), over
    tokens
    """
    batch = problem.batch
    features = features_of(batch, problem.target)
    keep = draw_masks(batch, features, int(n_masks), p_keep, seed)
    with forward_precision(precision):
        y = score_samples(problem, features, keep, removal, output, internal_batch_size)
    importance = torch.einsum("bs,bsm->bm", y.double(), keep.double()) / (int(n_masks) * p_keep)
    return to_tokens(features, importance.float(), batch.seq_len)
