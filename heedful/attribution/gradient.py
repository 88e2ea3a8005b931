"""Gradient methods on the word embeddings: saliency, gradient x input, integrated gradients, SmoothGrad.

All back-propagate the target logit (:meth:`ResolvedTarget.score`) to the word embeddings
``e`` ``[B, N, E]`` and reduce over the embedding dimension to one score per token.
"""

from __future__ import annotations

import numpy as np
import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.attribution._common import example_generators, length_chunks
from heedful.batch import Batch
from heedful.errors import InputError
from heedful.registry import register
from heedful.targets import ResolvedTarget

GRADIENT_TASKS = ("classification", "regression", "masked_lm", "causal_lm")
IG_BASELINES = ("pad", "mask", "zero")
IG_RULES = ("gausslegendre", "riemann_trapezoid", "riemann_middle", "riemann_left", "riemann_right")


def embedding_gradient(
    adapter: ModelAdapter, batch: Batch, target: ResolvedTarget, embeds: torch.Tensor
) -> torch.Tensor:
    """``d score / d e`` for word embeddings ``embeds`` ``[B, N, E]`` (one forward + one backward)."""
    embeds = embeds.detach().requires_grad_(True)
    with torch.enable_grad():
        fwd = adapter.forward(batch, target.anchor, inputs_embeds=embeds)
        return adapter.grad(target.score(fwd.logits), embeds)


def _trimmed_masks(batch: Batch, example: torch.Tensor, width: int) -> dict[str, torch.Tensor | None]:
    """Attention mask and token types of examples ``example`` ``[R]``, cut to ``width`` positions."""
    types = batch.token_type_ids
    return {
        "attention_mask": batch.attention_mask[example, :width],
        "token_type_ids": None if types is None else types[example, :width],
    }


def gradient_reference(adapter: ModelAdapter, batch: Batch, anchor: torch.Tensor) -> Forward:
    """Reference pass of the single-pass gradient methods: the forward pass from the word
    embeddings with its autograd graph kept, so that the method needs one backward pass and no
    second forward. Rows run in groups of similar length, each cut to its longest row."""
    embeds = adapter.embed(batch.input_ids).detach().requires_grad_(True)
    parts, order = [], []
    with torch.enable_grad():
        for rows, width in length_chunks(batch.lengths):
            fwd = adapter.forward(
                batch, anchor[rows], inputs_embeds=embeds[rows, :width], **_trimmed_masks(batch, rows, width)
            )
            parts.append(fwd.logits)
            order.append(rows)
        logits = torch.cat(parts)[torch.argsort(torch.cat(order))]
    return Forward(logits=logits, inputs_embeds=embeds)


def _gradient_and_input(
    adapter: ModelAdapter, batch: Batch, target: ResolvedTarget, reference: Forward | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d score / d e, e)`` for the word embeddings, through the reference pass when it kept
    its graph (:func:`gradient_reference`), otherwise with a pass of its own."""
    if reference is not None and reference.inputs_embeds is not None:
        embeds = reference.inputs_embeds
        with torch.enable_grad():
            grad = adapter.grad(target.score(reference.logits), embeds)
        return grad, embeds.detach()
    embeds = adapter.embed(batch.input_ids)
    return embedding_gradient(adapter, batch, target, embeds), embeds


@register(
    "saliency",
    family="gradient",
    cost="1 forward + 1 backward",
    citation="Simonyan et al. 2014, Deep Inside Convolutional Networks (Eq. 2); L2 norm over the embedding",
    summary="L2 norm of the gradient of the target logit w.r.t. each word embedding.",
    tasks=GRADIENT_TASKS,
    reference_pass=gradient_reference,
)
def saliency(
    adapter: ModelAdapter, batch: Batch, target: ResolvedTarget, reference: Forward | None = None
) -> torch.Tensor:
    """``||d f / d e_i||_2`` per token ``[B, N]`` (unsigned)."""
    grad, _ = _gradient_and_input(adapter, batch, target, reference)
    return grad.norm(dim=-1)


@register(
    "grad_x_input",
    family="gradient",
    cost="1 forward + 1 backward",
    citation="Shrikumar et al. 2016 / Denil et al. 2014: gradient x input, summed over the embedding",
    summary="Dot product of each word embedding with its gradient (signed).",
    tasks=GRADIENT_TASKS,
    reference_pass=gradient_reference,
)
def grad_x_input(
    adapter: ModelAdapter, batch: Batch, target: ResolvedTarget, reference: Forward | None = None
) -> torch.Tensor:
    """``sum_d e_id * (d f / d e_id)`` per token ``[B, N]``."""
    grad, embeds = _gradient_and_input(adapter, batch, target, reference)
    return (grad * embeds).sum(dim=-1)


def path_points(n_steps: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Interpolation points ``alpha`` in [0, 1] and their quadrature weights (summing to 1)."""
    if n_steps < 1:
        raise InputError(f"n_steps must be at least 1, got {n_steps}")
    if rule == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(n_steps)
        return (x + 1) / 2, w / 2
    if rule == "riemann_trapezoid":
        if n_steps < 2:
            raise InputError("the trapezoid rule needs n_steps >= 2")
        alphas = np.linspace(0, 1, n_steps)
        w = np.full(n_steps, 1.0 / (n_steps - 1))
        w[[0, -1]] /= 2
        return alphas, w
    offsets = {"riemann_left": 0.0, "riemann_right": 1.0, "riemann_middle": 0.5}
    if rule not in offsets:
        raise InputError(f"unknown integration rule {rule!r}", hint=f"use one of {', '.join(IG_RULES)}")
    alphas = (np.arange(n_steps) + offsets[rule]) / n_steps
    return alphas, np.full(n_steps, 1.0 / n_steps)


def baseline_embeddings(adapter: ModelAdapter, batch: Batch, baseline: str) -> torch.Tensor:
    """Reference input ``[B, N, E]``: content tokens replaced by ``[PAD]`` / ``[MASK]`` embeddings
    (special tokens kept, as is usual for text), or all-zero embeddings."""
    embeds = adapter.embed(batch.input_ids)
    if baseline == "zero":
        return torch.zeros_like(embeds)
    if baseline == "pad":
        token = adapter.pad_token_id
    elif baseline == "mask":
        token = getattr(adapter.tokenizer, "mask_token_id", None)
        if token is None:
            raise InputError("this tokenizer has no mask token", hint="use baseline='pad' or 'zero'")
    else:
        raise InputError(f"unknown baseline {baseline!r}", hint=f"use one of {', '.join(IG_BASELINES)}")
    ids = torch.where(batch.content_mask, torch.full_like(batch.input_ids, int(token)), batch.input_ids)
    return adapter.embed(ids)


@register(
    "integrated_gradients",
    family="gradient",
    cost="n_steps x (1 forward + 1 backward)",
    citation="Sundararajan et al. 2017, Axiomatic Attribution for Deep Networks (Eq. 1, Riemann/Gauss-Legendre approximation)",
    summary="Path integral of gradients from a baseline to the input, times (input - baseline).",
    tasks=GRADIENT_TASKS,
    defaults={"n_steps": 50, "baseline": "pad", "rule": "gausslegendre"},
)
def integrated_gradients(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    reference: Forward | None = None,
    n_steps: int = 50,
    baseline: str = "pad",
    rule: str = "gausslegendre",
    internal_batch_size: int | None = None,
) -> torch.Tensor:
    """``IG_i = sum_d (e_id - e'_id) * sum_s w_s dF(e' + a_s (e - e'))/de_id``  ``[B, N]``.

    All ``B x n_steps`` interpolated inputs run as expanded batches, in chunks of rows of similar
    length, each cut to its longest row and holding at most about 16k token positions (or
    ``internal_batch_size`` rows; see :func:`~heedful.attribution._common.length_chunks`). Completeness:
    ``sum_i IG_i ~= F(e) - F(e')``.
    """
    alphas, weights = path_points(n_steps, rule)
    embeds = adapter.embed(batch.input_ids).detach()
    base = baseline_embeddings(adapter, batch, baseline).detach()
    delta = embeds - base
    bsz, seq, dim = embeds.shape
    alpha_t = torch.as_tensor(alphas, dtype=embeds.dtype)
    weight_t = torch.as_tensor(weights, dtype=embeds.dtype)
    # row r = example r // n_steps at step r % n_steps; chunks group rows of similar length
    expanded_target = target.repeat(n_steps)
    total = torch.zeros(bsz, seq, dim, dtype=embeds.dtype)
    for rows, width in length_chunks(batch.lengths.repeat_interleave(n_steps), internal_batch_size):
        example = rows // n_steps
        step = rows % n_steps
        points = (base[example, :width] + alpha_t[step, None, None] * delta[example, :width]).requires_grad_(True)
        sub_target = expanded_target.select(rows)
        with torch.enable_grad():
            fwd = adapter.forward(
                batch,
                sub_target.anchor,
                inputs_embeds=points,
                **_trimmed_masks(batch, example, width),
            )
            grads = adapter.grad(sub_target.score(fwd.logits), points)
        total[:, :width].index_add_(0, example, grads * weight_t[step, None, None])
    return (total * delta).sum(dim=-1)


@register(
    "smoothgrad",
    family="gradient",
    cost="n_samples x (1 forward + 1 backward)",
    citation="Smilkov et al. 2017, SmoothGrad: removing noise by adding noise (Eq. 3)",
    summary="Saliency averaged over Gaussian-noised copies of the embeddings.",
    tasks=GRADIENT_TASKS,
    stochastic=True,
    defaults={"n_samples": 20, "noise_level": 0.15},
)
def smoothgrad(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    reference: Forward | None = None,
    n_samples: int = 20,
    noise_level: float = 0.15,
    multiply_by_inputs: bool = False,
    seed: int | None = 0,
    internal_batch_size: int | None = None,
) -> torch.Tensor:
    """``M(e) = 1/n sum_k grad F(e + z_k)``, ``z_k ~ N(0, sigma^2)``, ``sigma = noise_level *
    (max(e) - min(e))`` per example (the paper's 10-20 % noise level). Reduced per token to the
    L2 norm (``[B, N]``), or to the dot product with the input when ``multiply_by_inputs``."""
    if n_samples < 1:
        raise InputError(f"n_samples must be at least 1, got {n_samples}")
    embeds = adapter.embed(batch.input_ids).detach()
    bsz, seq, dim = embeds.shape
    real = batch.attention_mask.bool()[:, :, None].expand_as(embeds)  # padding must not set sigma
    inf = torch.finfo(embeds.dtype).max
    span = embeds.masked_fill(~real, -inf).flatten(1).amax(dim=1) - embeds.masked_fill(
        ~real, inf
    ).flatten(1).amin(dim=1)
    sigma = noise_level * span  # [B]
    noise = torch.zeros(bsz, n_samples, seq, dim, dtype=embeds.dtype)
    for b, (gen, n) in enumerate(zip(example_generators(batch, seed), batch.lengths.tolist(), strict=True)):
        noise[b, :, :n] = torch.randn((n_samples, n, dim), generator=gen, dtype=embeds.dtype)
    noise = noise.flatten(0, 1)
    expanded_target = target.repeat(n_samples)
    total = torch.zeros_like(embeds)
    for rows, width in length_chunks(batch.lengths.repeat_interleave(n_samples), internal_batch_size):
        example = rows // n_samples
        noisy = (embeds[example, :width] + noise[rows, :width] * sigma[example, None, None]).requires_grad_(True)
        sub_target = expanded_target.select(rows)
        with torch.enable_grad():
            fwd = adapter.forward(
                batch,
                sub_target.anchor,
                inputs_embeds=noisy,
                **_trimmed_masks(batch, example, width),
            )
            grads = adapter.grad(sub_target.score(fwd.logits), noisy)
        total[:, :width].index_add_(0, example, grads)
    mean_grad = total / n_samples
    if multiply_by_inputs:
        return (mean_grad * embeds).sum(dim=-1)
    return mean_grad.norm(dim=-1)
