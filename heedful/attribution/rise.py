"""RISE for text: random binary keep-masks over tokens, importance = output-weighted mask mean."""

from __future__ import annotations

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.attribution._common import example_generators
from heedful.attribution._masks import features_of, score_samples, to_tokens
from heedful.batch import Batch
from heedful.errors import InputError
from heedful.registry import register
from heedful.targets import ResolvedTarget


@register(
    "rise",
    family="perturbation",
    cost="n_masks forwards (batched)",
    citation="Petsiuk et al. 2018, RISE: Randomized Input Sampling for Explanation (Eq. 6), over tokens",
    summary="Mean output over random token keep-masks, weighted by whether each token was kept.",
    stochastic=True,
    defaults={"n_masks": 500, "p_keep": 0.5, "removal": "auto", "output": "probability", "seed": 0},
)
def rise(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    reference: Forward | None = None,
    n_masks: int = 500,
    p_keep: float = 0.5,
    removal: str = "auto",
    output: str = "probability",
    seed: int | None = 0,
    internal_batch_size: int | None = None,
) -> torch.Tensor:
    """``S_j = 1 / (n_masks * p) * sum_m f(x . m_m) m_m[j]`` per removable token ``[B, N]``.

    Masks keep each removable token independently with probability ``p_keep`` (RISE's
    ``p = 0.5``); removed tokens become the ``removal`` token (deleted for causal LMs); special
    tokens are always kept and score 0. Token masks need no up-sampling (the image method's
    smooth masks have no text analogue). ``output``: class probability (RISE's choice) or logit.
    ``n_masks`` 500 is ours (the paper uses 4000-8000 for images with many more cells).
    """
    if int(n_masks) < 1:
        raise InputError(f"n_masks must be at least 1, got {n_masks}")
    if not 0.0 < p_keep < 1.0:
        raise InputError(f"p_keep must be in (0, 1), got {p_keep}")
    features = features_of(batch, target)
    keep = torch.zeros(len(batch), int(n_masks), features.width, dtype=torch.bool)
    for b, (g, m) in enumerate(zip(example_generators(batch, seed), features.counts.tolist(), strict=True)):
        keep[b, :, :m] = torch.rand((int(n_masks), m), generator=g) < p_keep
    y = score_samples(adapter, batch, target, features, keep, removal, output, internal_batch_size)
    importance = torch.einsum("bs,bsm->bm", y.double(), keep.double()) / (int(n_masks) * p_keep)
    return to_tokens(features, importance.float(), batch.seq_len)
