"""Gradient norm averaged over a sliding window of neighbouring tokens."""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F

import heedful
from heedful.attribution.gradient import gradient_reference, saliency
from heedful.engine.options import AT_LEAST_ONE

GRADIENT_TASKS = ("classification", "regression", "masked_lm", "causal_lm")


def window_mean(scores: torch.Tensor, mask: torch.Tensor, window: int) -> torch.Tensor:
    """Mean of ``scores`` ``[B, N]`` over the real positions (``mask``) of the window of
    ``window`` positions centred on each position -- ``(window - 1) // 2`` before it and
    ``window // 2`` after it, cut at the ends of the row -- and 0 on padding."""
    mask = mask.to(scores.dtype)
    kernel = torch.ones(1, 1, window, dtype=scores.dtype, device=scores.device)
    padding = ((window - 1) // 2, window // 2)
    total = F.conv1d(F.pad((scores * mask)[:, None], padding), kernel)[:, 0]
    count = F.conv1d(F.pad(mask[:, None], padding), kernel)[:, 0]
    return torch.where(mask > 0, total / count.clamp(min=1), torch.zeros_like(total))


@heedful.register(
    "gradient_norm_window",
    family="gradient",
    cost="1 forward + 1 backward",
    tasks=GRADIENT_TASKS,
    reference=gradient_reference,
    spans=True,
)
def gradient_norm_window(problem: heedful.Problem, *, window: Annotated[int, AT_LEAST_ONE] = 3) -> torch.Tensor:
    """L2 norm of the target logit's gradient w.r.t. each word embedding, averaged over a window of tokens.

    ``mean_{j in W(i)} ||d f / d e_j||_2`` per token ``[B, N]``, ``W(i)`` the ``window`` real
    tokens centred on ``i`` (``(window - 1) // 2`` before, ``window // 2`` after; fewer at the
    ends of the text; special tokens included). ``window=1`` is ``saliency``. Encoder--decoders
    are not supported: a window would straddle their source and target sides.

    Source: Simonyan et al. 2014, Deep Inside Convolutional Networks (Eq. 2), L2 norm over the
    embedding, smoothed over a sliding window of tokens
    """
    scores = saliency(problem, aggregate="l2")
    return window_mean(scores, problem.batch.attention_mask.to(scores.device), window)
