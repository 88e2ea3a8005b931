"""Perturbation methods that remove tokens and watch the output: occlusion and its window-1 case,
leave-one-out, on one ablation core (:mod:`heedful.engine.ablation`), as Captum's ``Occlusion`` is its
``FeatureAblation`` with sliding windows for features."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch

from heedful.attribution._precision import MethodPrecision
from heedful.engine.ablation import removal_drops, sliding_windows, token_means
from heedful.engine.options import AT_LEAST_ONE, RUNTIME
from heedful.engine.perturb import Removal
from heedful.engine.problem import Problem
from heedful.registry import register

Output = Literal["logit", "probability"]


def _occluded(
    problem: Problem, window: int, stride: int, removal: str, output: str, precision: str, rows: int | None
) -> torch.Tensor:
    """Each token's mean output drop over the windows of ``window`` removable tokens (every
    ``stride``) that hold it ``[B, N]``: the core of :func:`occlusion` and :func:`leave_one_out`."""
    remove = sliding_windows(problem, window, stride)  # [B, K, N]
    drops = removal_drops(problem, remove, output=output, removal=removal, precision=precision, rows=rows)
    return token_means(remove, drops)


def _windows(tokens: int, window: int, stride: int) -> int:
    """Windows of ``window`` tokens every ``stride`` over ``tokens`` tokens (Captum's shift count)."""
    return math.ceil(max(tokens - window, 0) / stride) + 1


@register(
    "occlusion",
    family="perturbation",
    cost="1 + K forwards, K = ceil((N - window) / stride) + 1 windows (batched)",
    passes=lambda o, n: (1 + _windows(n, o["window"], o["stride"]), 0),
)
@torch.no_grad()
def occlusion(
    problem: Problem,
    *,
    window: Annotated[int, AT_LEAST_ONE] = 3,
    stride: Annotated[int, AT_LEAST_ONE] = 1,
    removal: Removal = "auto",
    output: Output = "logit",
    precision: MethodPrecision = "fp32",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Mean output drop over the sliding windows of tokens that hold each token.

    ``Occ_i = mean_{w : i in w} f(x) - f(x \\ w)`` over windows ``w`` of ``window`` consecutive
    removable tokens starting every ``stride`` tokens (special tokens and a fixed anchor are
    skipped, neither removed nor counted; the last window is cut at the text's end); 0 for
    special tokens ``[B, N]``. ``stride`` may not exceed ``window``. ``removal``, ``output`` and
    ``precision`` as for leave-one-out, which is ``window=1``.

    Source: Zeiler & Fergus 2014, Visualizing and Understanding Convolutional Networks (Sec. 4.2,
    occlusion sensitivity), over tokens; overlapping windows averaged per token as Captum's Occlusion
    """
    return _occluded(problem, window, stride, removal, output, precision, internal_batch_size)


@register("leave_one_out", family="perturbation", cost="1 + N forwards (batched)", passes=lambda o, n: (1 + n, 0))
@torch.no_grad()
def leave_one_out(
    problem: Problem,
    *,
    removal: Removal = "auto",
    output: Output = "logit",
    precision: MethodPrecision = "fp32",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Output drop when each token alone is removed (replaced by [MASK], or deleted for causal LMs).

    ``LOO_i = f(x) - f(x \\ x_i)`` for every removable token; 0 for special tokens ``[B, N]``.

    Occlusion (:func:`occlusion`) with windows of one token. ``removal="auto"`` uses the model's
    removal token (``[MASK]`` for encoders; deletion for causal LMs); ``output`` chooses the target logit or its probability as ``f``. All ``sum_b
    N_b`` perturbed copies run through the batched runner, at ``precision`` (``"bf16"`` /
    ``"int8"``: :mod:`heedful.engine.precision`; ``f(x)`` then runs at that precision too).

    Source: Li et al. 2016, Understanding Neural Networks through Representation Erasure (Eq. 2)
    """
    return _occluded(problem, 1, 1, removal, output, precision, internal_batch_size)
