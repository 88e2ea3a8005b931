"""Gradient methods on the word embeddings: saliency, gradient x input, integrated gradients, SmoothGrad.

All back-propagate the target logit (:meth:`ResolvedTarget.score`) to the word embeddings
``e`` ``[B, N, E]``, which gives one attribution per token and embedding dimension ``a``
``[B, N, E]`` (the gradient, gradient x input, ...), and reduce it over the embedding dimension
to one score per token with ``aggregate`` (:func:`aggregate_embedding`):

* ``"sum"`` -- ``sum_d a_id``, signed (gradient x input is then the dot product ``g_i . e_i``);
* ``"l1"`` -- ``||a_i||_1 = sum_d |a_id|``, unsigned: the aggregation of the gradient baselines in
  Abbasi et al. 2025, NormXLogit (§4, "Input Attribution Methods": Gradient Norm, Gradient x
  Input and Integrated Gradients all aggregated with the l1 norm);
* ``"l2"`` -- ``||a_i||_2``, unsigned (saliency's norm, Simonyan et al. 2014).

Each method keeps its usual default (saliency and SmoothGrad ``"l2"``; gradient x input,
integrated gradients and SmoothGrad with ``multiply_by_inputs`` ``"sum"``). A bare gradient
(saliency, SmoothGrad without ``multiply_by_inputs``) takes only the norms: its signed sum is no
token score -- where the embeddings go through a LayerNorm (BERT, RoBERTa, DeBERTa, ELECTRA) the
LayerNorm's Jacobian removes the mean direction and the sum is 0 up to rounding.
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
AGGREGATES = ("sum", "l1", "l2")
"""How per-dimension attributions ``[B, N, E]`` become token scores ``[B, N]``: signed sum, l1
norm, l2 norm (see the module docstring)."""
GRADIENT_AGGREGATES = ("l2", "l1")
"""The reductions of a bare gradient (saliency): norms only."""


def check_aggregate(aggregate: str, allowed: tuple[str, ...] = AGGREGATES) -> str:
    """``aggregate`` if it is one of ``allowed``, else an :class:`InputError` naming them."""
    if not isinstance(aggregate, str) or aggregate not in allowed:
        raise InputError(
            f"unknown aggregate {aggregate!r}, not one of {', '.join(repr(a) for a in allowed)}",
            hint=f"use one of {', '.join(allowed)} ({', '.join(_AGGREGATE_NAMES[a] for a in allowed)} over the embedding)",
        )
    return aggregate


_AGGREGATE_NAMES = {"sum": "signed sum", "l1": "l1 norm", "l2": "l2 norm"}


def aggregate_embedding(values: torch.Tensor, aggregate: str) -> torch.Tensor:
    """Per-dimension attributions ``values`` ``[B, N, E]`` -> token scores ``[B, N]``:
    ``"sum"`` ``sum_d v_id`` (signed), ``"l1"`` ``sum_d |v_id|``, ``"l2"`` ``sqrt(sum_d v_id^2)``."""
    check_aggregate(aggregate)
    if aggregate == "sum":
        return values.sum(dim=-1)
    return values.norm(p=1 if aggregate == "l1" else 2, dim=-1)


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
    citation="Simonyan et al. 2014, Deep Inside Convolutional Networks (Eq. 2); L2 norm over the embedding "
    "(aggregate='l1': NormXLogit §4's Gradient Norm)",
    summary="L2 norm of the gradient of the target logit w.r.t. each word embedding.",
    tasks=GRADIENT_TASKS,
    defaults={"aggregate": "l2"},
    choices={"aggregate": GRADIENT_AGGREGATES},
    reference_pass=gradient_reference,
)
def saliency(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    reference: Forward | None = None,
    aggregate: str = "l2",
) -> torch.Tensor:
    """``||d f / d e_i||_2`` per token ``[B, N]`` (unsigned; Simonyan et al. 2014, Eq. 2, with
    the gradient ``d f / d e_i`` ``[B, N, E]`` reduced over the embedding).

    ``aggregate``: ``"l2"`` (default) or ``"l1"`` (``sum_d |d f / d e_id|``, NormXLogit §4's
    "Gradient Norm"); a signed sum of the gradient is no token score (see the module docstring).
    """
    check_aggregate(aggregate, GRADIENT_AGGREGATES)
    grad, _ = _gradient_and_input(adapter, batch, target, reference)
    return aggregate_embedding(grad, aggregate)


@register(
    "grad_x_input",
    family="gradient",
    cost="1 forward + 1 backward",
    citation="Shrikumar et al. 2016 / Denil et al. 2014: gradient x input, summed over the embedding "
    "(aggregate='l1': NormXLogit §4)",
    summary="Dot product of each word embedding with its gradient (signed).",
    tasks=GRADIENT_TASKS,
    defaults={"aggregate": "sum"},
    choices={"aggregate": AGGREGATES},
    reference_pass=gradient_reference,
)
def grad_x_input(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    reference: Forward | None = None,
    aggregate: str = "sum",
) -> torch.Tensor:
    """``sum_d e_id * (d f / d e_id)`` per token ``[B, N]``: the per-dimension products
    ``e * d f / d e`` ``[B, N, E]`` summed over the embedding (signed).

    ``aggregate``: ``"sum"`` (default), ``"l1"`` (``sum_d |e_id * d f / d e_id|``, unsigned: the
    aggregation of NormXLogit §4's tables) or ``"l2"``.
    """
    check_aggregate(aggregate)
    grad, embeds = _gradient_and_input(adapter, batch, target, reference)
    return aggregate_embedding(grad * embeds, aggregate)


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
    defaults={"n_steps": 50, "baseline": "pad", "rule": "gausslegendre", "aggregate": "sum"},
    choices={"baseline": IG_BASELINES, "rule": IG_RULES, "aggregate": AGGREGATES},
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
    aggregate: str = "sum",
) -> torch.Tensor:
    """``IG_i = sum_d (e_id - e'_id) * sum_s w_s dF(e' + a_s (e - e'))/de_id``  ``[B, N]``: the
    per-dimension attributions ``IG_id`` ``[B, N, E]`` of Eq. 1 summed over the embedding.

    ``aggregate``: ``"sum"`` (default; signed, keeps completeness), ``"l1"`` (``sum_d |IG_id|``,
    NormXLogit §4's aggregation) or ``"l2"`` (``||IG_i||_2``); the norms are unsigned and do not
    sum to ``F(e) - F(e')``.

    All ``B x n_steps`` interpolated inputs run as expanded batches, in chunks of rows of similar
    length, each cut to its longest row and holding at most about 16k token positions (or
    ``internal_batch_size`` rows; see :func:`~heedful.attribution._common.length_chunks`). Completeness:
    ``sum_i IG_i ~= F(e) - F(e')``.
    """
    check_aggregate(aggregate)
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
    return aggregate_embedding(total * delta, aggregate)


@register(
    "smoothgrad",
    family="gradient",
    cost="n_samples x (1 forward + 1 backward)",
    citation="Smilkov et al. 2017, SmoothGrad: removing noise by adding noise (Eq. 3)",
    summary="Saliency averaged over Gaussian-noised copies of the embeddings.",
    tasks=GRADIENT_TASKS,
    stochastic=True,
    defaults={"n_samples": 20, "noise_level": 0.15, "aggregate": None},
    choices={"aggregate": (None, *AGGREGATES)},
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
    aggregate: str | None = None,
) -> torch.Tensor:
    """``M(e) = 1/n sum_k grad F(e + z_k)`` ``[B, N, E]`` (Eq. 3), ``z_k ~ N(0, sigma^2)``,
    ``sigma = noise_level * (max(e) - min(e))`` per example (the paper's 10-20 % noise level),
    times the input ``e`` when ``multiply_by_inputs``, reduced per token to ``[B, N]`` by
    ``aggregate``: ``"l2"`` / ``"l1"`` norm, or with ``multiply_by_inputs`` also the signed
    ``"sum"``, over the embedding. ``None`` (default): the L2 norm of ``M(e)``, or the dot
    product ``sum_d M(e)_id e_id`` with ``multiply_by_inputs``."""
    if aggregate is None:
        aggregate = "sum" if multiply_by_inputs else "l2"
    check_aggregate(aggregate, AGGREGATES if multiply_by_inputs else GRADIENT_AGGREGATES)
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
    return aggregate_embedding(mean_grad * embeds if multiply_by_inputs else mean_grad, aggregate)
