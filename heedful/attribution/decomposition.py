"""Token decomposition of a transformer's forward pass, and DecompX.

The decomposition methods (DecompX here; ALTI, ALTI-Logit and GlobEnc in
:mod:`heedful.attribution.contributions`) read every block of one recording pass -- its input,
attention probabilities, value vectors, the inputs of its norms, the MLP's pre-activations --
and rewrite each operation as a sum over source tokens. This module holds what they share:

* :func:`recordings`: one pass per group of examples under an interception that keeps each
  block's tensors (:class:`BlockRecord`), the groups of similar length cut so that the
  decomposition's ``O(N^2 D)`` states stay under the adapter's ``max_memory``;
* the linear algebra of the roles: weights of a projection role (:func:`affine`), norms
  linearised with the real token's statistics (:func:`norm_scale`, :func:`norm_linear`), a
  bias spread over the sources (:func:`spread`), the head chain (``HeadRoles.steps``) applied to
  a decomposition (:func:`decompose_head`);
* DecompX (:func:`decompx`), whose state ``X [B, N, K, D]`` holds, for every position ``i``, the
  part ``X[i, k]`` of its residual-stream vector that comes from input token ``k``.

Every operation is exact: the parts sum to the model's own vectors (a guard compares them with
the recorded ones after every block and refuses a model whose blocks its roles do not
describe), so with biases and the head the sum over tokens is the explained logit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from heedful.adapters import ModelAdapter
from heedful.adapters.roles import (
    Activation,
    BlockRoles,
    HeadStep,
    LinearSite,
    ModelRoles,
    NormSite,
    Projection,
    Site,
)
from heedful.engine.chunks import length_chunks
from heedful.engine.memory import format_bytes
from heedful.engine.problem import Problem
from heedful.engine.runner import Runner
from heedful.errors import InputError, UnsupportedModelError
from heedful.registry import register

BiasRule = Literal["absdot", "abssim", "norm", "equal"]
"""How a bias is shared among the sources (DecompX's ``bias_decomp_type``): by the absolute dot
product of each source's part with the bias (``absdot``), the absolute cosine (``abssim``), the
part's norm (``norm``), or equally among the sources with a non-zero part (``equal``)."""

GUARD = 1e-3
"""Largest relative error of a decomposition's sum against the model's own vector before the
model is refused (float32 rounding stays orders below; a block the roles describe wrongly is
orders above). A model stored in half precision computes its parts in its own dtype: the bound
is then :data:`HALF_GUARD` units of that dtype's rounding (bfloat16: 0.031, float16: 0.0039)."""
HALF_GUARD = 4
"""A half-precision model's bound on the relative error, in units of its dtype's ``eps``
(bfloat16 rounds each of the dozens of parts' sums to 2**-8; 0.0079 measured on a tiny Llama)."""

FLOAT_BYTES = 4

GROUP_OVERHEAD = 128
"""The fixed cost of one group of examples (its recording pass and the per-block calls) in the
units of :func:`heedful.engine.chunks.length_chunks` with ``power=2`` (one position's row of parts):
about one example of 11 tokens, measured on MiniLM -- so examples of different lengths are
decomposed apart rather than padded together (a padded position costs a whole row of parts)."""


def working(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached in the precision decompositions run in: float64 when it is float64, else
    float32 (half-precision models are decomposed in float32)."""
    return t.detach().to(torch.float64 if t.dtype == torch.float64 else torch.float32)

TRANSIENT = 2**25
"""Values the per-position transients of a decomposition step may hold at least (128 MiB in
float32), whatever the size of the state (short inputs would otherwise run a few positions at a
time, in many small products)."""


# ---------------------------------------------------------------------------- recording
@dataclass
class BlockRecord:
    """What one block computed in the recording pass (:func:`working` precision; ``B`` examples of the group,
    ``N`` positions, ``H`` heads, ``Hkv`` key/value heads of width ``d``, ``F`` MLP width):

    ``block_in`` ``[B, N, D]`` the residual stream entering the block; ``probs`` ``[B, H, N, N]``;
    ``value`` ``[B, N, Hkv*d]`` the value projection's output (bias included); ``attn_norm_in``
    and ``mlp_norm_in`` ``[B, N, D]`` the inputs of the block's two norms; ``attn_out`` ``[B, N,
    D]`` the attention output projection; ``mlp_up`` ``[B, N, F]`` the MLP's first projection
    (its pre-activation, or the up projection of a gated MLP) and ``mlp_gate`` the gate
    projection (``None`` without a gate); ``block_out`` ``[B, N, D]``."""

    block_in: torch.Tensor
    probs: torch.Tensor
    value: torch.Tensor
    attn_norm_in: torch.Tensor
    mlp_norm_in: torch.Tensor
    attn_out: torch.Tensor
    mlp_up: torch.Tensor
    mlp_gate: torch.Tensor | None
    block_out: torch.Tensor


@dataclass
class Recording:
    """One recording pass over examples ``rows`` of a problem cut to ``width`` positions:
    ``blocks`` (one :class:`BlockRecord` per block), ``final_in`` ``[B, N, D]`` the input of a
    pre-LN decoder's final norm (``None`` without one), ``logits`` the head's outputs at the
    anchors ``[B, C]``, ``anchor`` ``[B]``, ``mask`` ``[B, N]``."""

    rows: torch.Tensor
    width: int
    blocks: list[BlockRecord]
    final_in: torch.Tensor | None
    logits: torch.Tensor
    anchor: torch.Tensor
    mask: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])


def _store(found: dict[int, torch.Tensor], layer: int, x, value: torch.Tensor) -> None:
    found[layer] = value


def _input_site(norm: NormSite) -> Site:
    return Site(norm.module, "input", layout=norm.layout)


def record(problem: Problem, rows: torch.Tensor, width: int, roles: ModelRoles) -> Recording:
    """One pass over examples ``rows`` of ``problem`` (cut to ``width`` positions) that keeps
    every block's tensors (:class:`BlockRecord`); the adapter counts it as one forward per row."""
    adapter = problem.adapter
    gated = all(block.mlp_gate is not None for block in roles.blocks)
    with torch.no_grad(), adapter.intercept() as hooks:
        found = {role: hooks.record(role) for role in ("block_in", "probs", "value", "attn_out", "mlp_up", "block_out")}
        gates = hooks.record("mlp_gate") if gated else {}
        norms: dict[str, dict[int, torch.Tensor]] = {"attn": {}, "mlp": {}}
        for layer, block in enumerate(roles.blocks):
            hooks.at(_input_site(block.attn_norm), partial(_store, norms["attn"], layer))
            hooks.at(_input_site(block.mlp_norm), partial(_store, norms["mlp"], layer))
        final = hooks.keep(_input_site(roles.final_norm)) if roles.final_norm is not None else None
        fwd = problem.forward(rows=rows, width=width)
    blocks = [
        BlockRecord(
            block_in=working(found["block_in"][layer]),
            probs=working(found["probs"][layer]),
            value=working(found["value"][layer]),
            attn_norm_in=working(norms["attn"][layer]),
            mlp_norm_in=working(norms["mlp"][layer]),
            attn_out=working(found["attn_out"][layer]),
            mlp_up=working(found["mlp_up"][layer]),
            mlp_gate=working(gates[layer]) if gated else None,
            block_out=working(found["block_out"][layer]),
        )
        for layer in range(len(roles.blocks))
    ]
    mask = problem.batch.attention_mask[rows, :width]
    return Recording(
        rows=rows,
        width=width,
        blocks=blocks,
        final_in=None if final is None else working(final.value),
        logits=working(fwd.logits),
        anchor=problem.anchor[rows],
        mask=mask,
    )


def example_bytes(adapter: ModelAdapter, width: int, states: float) -> int:
    """Estimated peak bytes per example of a decomposition over ``width`` positions that keeps
    ``states`` tensors of ``[N, N, D]`` alive at once, plus its recording of every block (the
    probabilities ``L x H x N x N``, eight ``N x D`` and two ``N x F`` tensors per block)."""
    shape = adapter.shape
    n, d = width, shape.hidden
    per_block = shape.heads * n * n + 8 * n * d + 2 * n * shape.intermediate
    return int(FLOAT_BYTES * (states * (n + 1) * n * d + shape.layers * per_block))


def recordings(problem: Problem, method: str, states: float) -> Iterator[Recording]:
    """Recording passes (:func:`record`) over groups of examples of similar length, each group
    as large as the adapter's ``max_memory`` allows for a decomposition keeping ``states``
    ``[N, N, D]`` tensors per example (:func:`example_bytes`) and the group's transients
    (:data:`TRANSIENT`); an :class:`InputError` before any pass when one example alone does
    not fit."""
    adapter = problem.adapter
    roles = adapter.roles()
    roles.require_plain(method)
    budget = Runner.for_problem(problem).max_memory - FLOAT_BYTES * TRANSIENT
    lengths = problem.batch.lengths
    longest = int(lengths.max())
    needed = example_bytes(adapter, longest, states)
    if needed > budget:
        raise InputError(
            f"{method} needs about {format_bytes(needed + FLOAT_BYTES * TRANSIENT)} for an input of {longest} tokens, "
            f"over the memory budget of {format_bytes(budget + FLOAT_BYTES * TRANSIENT)}",
            hint="raise max_memory (--max-memory) or shorten the input",
        )
    chunks = length_chunks(
        lengths, max_rows=lambda w: budget // example_bytes(adapter, w, states), power=2, overhead=GROUP_OVERHEAD
    )
    for rows, width in chunks:
        yield record(problem, rows, width, roles)


def position_chunks(width: int, columns: int, per_position: int, states: int) -> Iterator[slice]:
    """Slices of ``width`` positions whose transient tensors -- ``columns`` sources (of all
    examples) of ``per_position`` values each per position -- hold at most ``states`` values in
    all, and at least :data:`TRANSIENT`."""
    step = max(1, max(states, TRANSIENT) // max(1, columns * per_position))
    for start in range(0, width, step):
        yield slice(start, min(width, start + step))


# ---------------------------------------------------------------------------- linear algebra
def affine(site: Site | LinearSite | Projection, transposed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight ``[out, in]`` and bias ``[out]`` (or ``None``) of a linear role (:func:`working` precision): a
    projection site (only its ``columns`` of a fused projection), a :class:`LinearSite` or a
    :class:`Projection`."""
    if isinstance(site, Projection):
        weight, bias = site.weight, site.bias
    else:
        module = site.module
        weight = LinearSite(module, site.transposed if isinstance(site, LinearSite) else transposed).weight()
        bias = getattr(module, "bias", None)
        if isinstance(site, Site):  # only its columns of a fused projection
            weight, bias = site.take(weight, 0), None if bias is None else site.take(bias)
    return working(weight), None if bias is None else working(bias)


def norm_scale(norm: NormSite, x: torch.Tensor) -> torch.Tensor:
    """``1 / sqrt(var(x) + eps)`` (LayerNorm) or ``1 / sqrt(mean(x^2) + eps)`` (RMSNorm) of the
    norm's real input ``x`` ``[..., D]`` -> ``[..., 1]``."""
    if norm.kind == "layernorm":
        spread_ = x.var(dim=-1, unbiased=False, keepdim=True)
    else:
        spread_ = x.pow(2).mean(dim=-1, keepdim=True)
    return torch.rsqrt(spread_ + norm.eps)


def norm_linear(norm: NormSite, parts: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The norm linearised at the real token's statistics, applied to each part ``[..., K, D]``
    of a token whose ``scale`` is ``[..., 1]`` (:func:`norm_scale`): ``w * (x_k - mean(x_k)) *
    scale`` (LayerNorm; centring is linear) or ``w * x_k * scale`` (RMSNorm). The parts of a
    token sum to its normalised vector without the norm's bias."""
    if norm.kind == "layernorm":
        parts = parts - parts.mean(dim=-1, keepdim=True)
    parts = parts * scale[..., None, :]
    weight = norm.gain()
    return parts if weight is None else parts * working(weight)


def norm_bias(norm: NormSite) -> torch.Tensor | None:
    """A LayerNorm's bias ``[D]`` (``None`` for RMSNorm and weightless norms)."""
    bias = getattr(norm.module, "bias", None) if norm.kind == "layernorm" else None
    return None if bias is None else working(bias)


def norm_apply(norm: NormSite, x: torch.Tensor) -> torch.Tensor:
    """The norm applied to real vectors ``x`` ``[..., D]`` (what its module computes)."""
    out = norm_linear(norm, x[..., None, :], norm_scale(norm, x))[..., 0, :]
    bias = norm_bias(norm)
    return out if bias is None else out + bias


def spread(parts: torch.Tensor, bias: torch.Tensor | None, rule: BiasRule, aside: bool) -> torch.Tensor:
    """``parts`` ``[..., K, D]`` with ``bias`` (``[D]``, or ``[..., D]`` per token) shared among
    the sources by ``rule`` (:data:`BiasRule`), so the parts still sum to the token's vector;
    ``aside``: the last column collects the bias instead (no source's)."""
    if bias is None:
        return parts
    b = bias.unsqueeze(-2)  # [1, D] or [..., 1, D]
    if aside:
        collected = torch.zeros_like(parts)
        collected[..., -1:, :] = b.expand(*parts.shape[:-2], 1, parts.shape[-1])
        return parts + collected
    if rule == "absdot":
        weights = (parts * b).sum(dim=-1).abs()
    elif rule == "abssim":
        weights = torch.nn.functional.cosine_similarity(parts, b, dim=-1).abs() * (parts.norm(dim=-1) != 0)
    elif rule == "norm":
        weights = parts.norm(dim=-1)
    else:
        weights = (parts.norm(dim=-1) != 0).to(parts.dtype)
    return parts + shares(weights)[..., None] * b


def shares(weights: torch.Tensor) -> torch.Tensor:
    """Non-negative ``weights`` ``[..., K]`` divided by their sum over the sources (0 where
    they sum to 0)."""
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(torch.finfo(weights.dtype).tiny), 0.0)


def project(parts: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rule: BiasRule, aside: bool) -> torch.Tensor:
    """``spread(parts @ weight.T, bias, rule, aside)`` for ``parts`` ``[..., K, in]`` and a
    ``weight`` ``[out, in]``, computed without a pass over the ``[..., K, out]`` result for the
    bias when the rule is ``absdot``: the dot products come from the input side,
    ``<W x_k, b> = <x_k, W^T b>``, and each part's share of the bias rides along in the same
    matrix product as an extra input column (``[x_k, w_k] @ [W^T; b]``) -- the MLP's wide up
    projections cost one product and nothing else."""
    if bias is None or aside or rule != "absdot":
        return spread(parts @ weight.T, bias, rule, aside)
    share = shares((parts @ (weight.T @ bias)).abs())
    return torch.cat([parts, share[..., None]], dim=-1) @ torch.cat([weight.T, bias[None]], dim=0)


def slope(activation, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation's output ``a = act(z)`` and its zero-origin slope ``a / z`` (0 where
    ``z = 0``) at the real pre-activations ``z``: ``slope * sum_k z_k = a`` exactly."""
    a = activation(z)
    return a, torch.where(z != 0, a / torch.where(z != 0, z, 1.0), 0.0)


def relative_error(parts_sum: torch.Tensor, real: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """Largest ``||sum - real|| / ||real||`` over the tokens ``[..., D]`` (real positions of
    ``mask`` only)."""
    err = (parts_sum - real).norm(dim=-1) / real.norm(dim=-1).clamp_min(1e-12)
    if mask is not None:
        err = err[mask.bool()]
    return float(err.max()) if err.numel() else 0.0


def guard(
    parts_sum: torch.Tensor, real: torch.Tensor, mask: torch.Tensor | None, family: str, where: str, stored: torch.dtype = torch.float32
) -> None:
    """Refuse the model when the parts do not add up to its own vector (:data:`GUARD`; for a
    model ``stored`` in half precision, :data:`HALF_GUARD`)."""
    err = relative_error(parts_sum, real, mask)
    bound = GUARD if torch.finfo(stored).bits >= 32 else max(GUARD, HALF_GUARD * torch.finfo(stored).eps)
    if not err <= bound:
        raise UnsupportedModelError(
            f"the token decomposition of this {family} model does not add up at {where} (relative error {err:.2g})",
            hint="its blocks compute something their roles do not describe; use a gradient or perturbation method",
        )


def mix(probs: torch.Tensor, values: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Attention applied to decomposed values: ``probs`` ``[B, H, n, N]`` (rows ``n`` of the
    queries), ``values`` ``[B, N, K, Hkv*d]`` the parts of every position's values -> the parts
    of the merged heads ``[B, n, K, H*d]``, ``C[i, k, h] = sum_j A_h[i, j] V[j, k, h']`` with
    ``h'`` the key/value head of query head ``h`` (grouped-query attention repeats each key/value
    head for its group, as ``transformers``' ``repeat_kv``)."""
    bsz, heads, n, seq = probs.shape
    _, _, k, width = values.shape
    d = width // kv_heads
    rep = heads // kv_heads
    v = values.reshape(bsz, seq, k, kv_heads, d).permute(0, 3, 1, 2, 4).reshape(bsz, kv_heads, seq, k * d)
    a = probs.reshape(bsz, kv_heads, rep * n, seq)
    c = (a @ v).reshape(bsz, kv_heads, rep, n, k, d)
    return c.permute(0, 3, 4, 1, 2, 5).reshape(bsz, n, k, heads * d)


def value_bias_out(block: BlockRoles, w_out: torch.Tensor, b_out: torch.Tensor | None) -> torch.Tensor | None:
    """What the value bias and the output projection's bias add to every position's attention
    output ``[D]``: ``W_O b_v + b_O`` (each row of the probabilities sums to 1, so the value bias
    passes whole), ``b_v`` repeated for the query heads of each key/value head."""
    _, b_v = affine(block.value, block.transposed)
    total = b_out
    if b_v is not None:
        kv_heads, heads = block.value.heads, block.context.heads
        per_head = b_v.reshape(kv_heads, 1, -1).expand(kv_heads, heads // kv_heads, -1).reshape(-1)
        through = w_out @ per_head
        total = through if total is None else total + through
    return total


# ---------------------------------------------------------------------------- head chain
@dataclass
class HeadParts:
    """The head chain applied to a decomposition of the anchor's representation: ``parts``
    ``[B, K, C']`` the output columns' parts, ``real`` ``[B, C']`` the columns' real values,
    ``columns`` ``[B, C']`` which output column each is (all outputs of a classifier, the
    target's tokens of a language model)."""

    parts: torch.Tensor
    real: torch.Tensor
    columns: torch.Tensor


def decompose_head(
    steps: tuple[HeadStep, ...],
    parts: torch.Tensor,
    real: torch.Tensor,
    columns: torch.Tensor | None,
    rule: BiasRule,
    aside: bool,
    biases: bool = True,
) -> HeadParts:
    """Push the parts ``[B, K, D]`` of the anchor's representation ``real`` ``[B, D]`` through
    the head chain: linear maps exactly (their bias spread by ``rule``, or left out without
    ``biases``), norms linearised at the real statistics, elementwise activations by their
    zero-origin slope at the real pre-activation (DecompX's ``tanh`` / GELU "ZO"). ``columns``
    ``[B, C']``: the output columns to keep (``None``: all)."""
    if not steps:
        raise UnsupportedModelError("the head of this model is not described as a chain", hint="use a gradient or perturbation method")
    last = len(steps) - 1
    for i, step in enumerate(steps):
        if isinstance(step, Activation):
            real, scale = slope(step.fn, real)
            parts = parts * scale[:, None, :]
        elif isinstance(step, NormSite):
            scale = norm_scale(step, real)
            parts = norm_linear(step, parts, scale)
            if biases:
                parts = spread(parts, norm_bias(step), rule, aside)
            real = norm_apply(step, real)
        else:
            weight, bias = affine(step)
            if i == last and columns is not None:
                picked = weight[columns]  # [B, C', E]
                parts = torch.einsum("bke,bce->bkc", parts, picked)
                real = torch.einsum("be,bce->bc", real, picked)
                bias = None if bias is None else bias[columns]
            else:
                parts = parts @ weight.T
                real = real @ weight.T
            if bias is not None:
                real = real + bias
                if biases:
                    parts = spread(parts, bias, rule, aside)
    if columns is None:
        columns = torch.arange(real.shape[-1], device=real.device).expand(real.shape[0], -1)
    return HeadParts(parts, real, columns)


def head_columns(problem: Problem, rows: torch.Tensor) -> torch.Tensor | None:
    """The output columns a decomposition of the head keeps: ``None`` (all) for classifiers,
    the target's tokens ``[B, K]`` for language models."""
    if problem.target.task in ("classification", "regression"):
        return None
    return problem.target.classes[rows]


def target_parts(problem: Problem, rows: torch.Tensor, head: HeadParts) -> torch.Tensor:
    """The explained scalar's parts ``[B, K]``: ``sum_c w_c parts[..., c]`` over the target's
    columns (weights ``w``: 1, or 1 and -1 for a contrast)."""
    classes = problem.target.classes[rows]  # [B, Kc]
    where = (head.columns[:, None, :] == classes[:, :, None]).to(head.parts.dtype)  # [B, Kc, C']
    picked = torch.einsum("bkc,bjc->bkj", head.parts, where)  # [B, K, Kc]
    return (picked * problem.target.weights.to(picked.dtype)).sum(dim=-1)


# ---------------------------------------------------------------------------- DecompX
@dataclass(frozen=True)
class Settings:
    """How DecompX treats biases and the MLP: ``rule`` shares each bias among the sources
    (:data:`BiasRule`); ``aside``: biases go to an extra last column instead (no token's);
    ``ffn``: the MLP's output is decomposed (otherwise dropped, as the reference's
    ``include_FFN=False``)."""

    rule: BiasRule = "absdot"
    aside: bool = False
    ffn: bool = True


def _normed(norm: NormSite, parts: torch.Tensor, real: torch.Tensor, settings: Settings) -> torch.Tensor:
    """``parts`` ``[B, n, K, D]`` through ``norm`` linearised at its real input ``real``
    ``[B, n, D]``, its bias shared among the sources."""
    return spread(norm_linear(norm, parts, norm_scale(norm, real)), norm_bias(norm), settings.rule, settings.aside)


Positions = slice | torch.Tensor
"""Positions of a block's output to compute: a slice (the same for every example) or an index
``[B, n]`` per example (the anchors)."""


def take(t: torch.Tensor, pos: Positions, dim: int = 1) -> torch.Tensor:
    """``t``'s entries at positions ``pos`` along ``dim`` (per example for an index ``[B, n]``)."""
    if isinstance(pos, slice):
        return t[(slice(None),) * dim + (pos,)]
    moved = t.movedim(dim, 1)
    return moved[torch.arange(t.shape[0], device=pos.device)[:, None], pos].movedim(1, dim)


def _mlp(parts: torch.Tensor, rec: BlockRecord, block: BlockRoles, pos: Positions, settings: Settings) -> torch.Tensor:
    """The MLP's output parts ``[B, n, K, D]`` from its input's parts ``[B, n, K, D]`` (positions
    ``pos``): the projections exactly (biases shared), the activation by its zero-origin slope
    ``act(z) / z`` at the real pre-activation. A gated MLP ``act(g) * u`` splits each cross term
    of the product evenly: ``p_k = (slope(g) * g_k * u + act(g) * u_k) / 2``, which sums to the
    product exactly."""
    w_up, b_up = affine(block.mlp_up, block.transposed)
    w_down, b_down = affine(block.mlp_out, block.transposed)
    act = block.mlp_act.module
    product = project(parts, w_up, b_up, settings.rule, settings.aside)  # [B, n, K, F], fresh: scaled in place
    if block.mlp_gate is not None:
        w_gate, b_gate = affine(block.mlp_gate, block.transposed)
        gate = project(parts, w_gate, b_gate, settings.rule, settings.aside)
        a, s = slope(act, take(rec.mlp_gate, pos))
        u = take(rec.mlp_up, pos)
        product = gate.mul_((0.5 * s * u)[:, :, None, :]).add_(product.mul_(0.5 * a[:, :, None, :]))
    else:
        _, s = slope(act, take(rec.mlp_up, pos))
        product.mul_(s[:, :, None, :])
    return spread(product @ w_down.T, b_down, settings.rule, settings.aside)


def propagate(
    parts: torch.Tensor, rec: BlockRecord, block: BlockRoles, settings: Settings, at: torch.Tensor | None = None
) -> torch.Tensor:
    """One block applied to the decomposition ``parts`` ``[B, N, K, D]`` of its input (part ``k``
    of position ``i``: what comes from input token ``k``) -> the decomposition of its output
    ``[B, N, K, D]``, or of its output at positions ``at`` ``[B, n]`` only ``[B, n, K, D]`` (the
    last block needs only the anchors).

    Attention: the values of each part (``X W_v^T``, pre-LN blocks normalising first), mixed by
    the recorded probabilities head by head and projected by ``W_O``, plus the residual; the
    biases ``W_O b_v + b_O`` shared among the sources. Norms linearised at the token's own
    statistics; the MLP by :func:`_mlp`. Positions are handled in chunks so that the MLP's
    ``[n, K, F]`` parts stay within one state's size."""
    bsz, seq, k, dim = parts.shape
    pre = block.pre_ln
    inputs = _normed(block.attn_norm, parts, rec.attn_norm_in, settings) if pre else parts
    w_value, _ = affine(block.value, block.transposed)
    values = inputs @ w_value.T  # [B, N, K, Hkv*d]
    del inputs
    w_out, b_out = affine(block.attn_out, block.transposed)
    bias = value_bias_out(block, w_out, b_out)
    width = rec.mlp_up.shape[-1]
    out = torch.empty_like(parts) if at is None else parts.new_empty(bsz, at.shape[1], k, dim)
    chunks = position_chunks(seq, bsz * k, 3 * width + 4 * dim, bsz * seq * k * dim) if at is None else [at]
    for pos in chunks:
        res = take(parts, pos) + mix(take(rec.probs, pos, 2), values, block.value.heads) @ w_out.T
        res = spread(res, bias, settings.rule, settings.aside)
        if not pre:
            res = _normed(block.attn_norm, res, take(rec.attn_norm_in, pos), settings)
        if settings.ffn:
            mlp_in = _normed(block.mlp_norm, res, take(rec.mlp_norm_in, pos), settings) if pre else res
            res = res + _mlp(mlp_in, rec, block, pos, settings)
        if not pre:
            res = _normed(block.mlp_norm, res, take(rec.mlp_norm_in, pos), settings)
        if at is not None:
            return res
        out[:, pos] = res
    return out


def initial_parts(rec: Recording, aside: bool) -> torch.Tensor:
    """The first block's input as parts ``[B, N, K, D]``: ``X[i, k] = delta_ik x_i`` (``K = N``,
    plus a column of biases when they are kept ``aside``)."""
    x = rec.blocks[0].block_in
    bsz, seq, dim = x.shape
    parts = x.new_zeros(bsz, seq, seq + int(aside), dim)
    idx = torch.arange(seq, device=x.device)
    parts[:, idx, idx] = x
    return parts


@dataclass
class Decomposed:
    """DecompX on one recording: ``scores`` ``[B, N]`` (``[B, L, N]`` layer-wise) for the
    tokens, and with the head the explained scalar's parts ``target`` ``[B, K]`` (the last
    column: biases kept aside, when they were) and the head's columns ``head`` (the anchor's
    parts through the head, their real values)."""

    scores: torch.Tensor
    target: torch.Tensor | None = None
    head: HeadParts | None = None


def _anchor_rows(parts: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    return parts[torch.arange(parts.shape[0], device=anchor.device), anchor]


def _at_layer(
    problem: Problem,
    rec: Recording,
    roles: ModelRoles,
    parts: torch.Tensor,
    real: torch.Tensor,
    classifier: bool,
    settings: Settings,
    anchored: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, HeadParts | None]:
    """Token scores ``[B, N]`` from the parts ``[B, N, K, D]`` of one layer's output (``anchored``:
    of its anchors only, ``[B, 1, K, D]``) whose real vectors are ``real`` ``[B, N, D]``: through a pre-LN decoder's final norm (at the layer's
    own statistics, as the logit lens) and the head chain, the target's parts; without the
    classifier the norms of the anchor's parts."""
    seq = rec.width
    anchor_parts = parts[:, 0] if anchored else _anchor_rows(parts, rec.anchor)  # [B, K, D]
    anchor_real = _anchor_rows(real, rec.anchor)  # [B, D]
    final = roles.final_norm
    if final is not None:
        scale = norm_scale(final, anchor_real)
        anchor_parts = spread(norm_linear(final, anchor_parts, scale), norm_bias(final), settings.rule, settings.aside)
        anchor_real = norm_apply(final, anchor_real)
    if not classifier:
        return anchor_parts[:, :seq].norm(dim=-1), None, None
    head = decompose_head(
        roles.head.steps, anchor_parts, anchor_real, head_columns(problem, rec.rows), settings.rule, settings.aside
    )
    target = target_parts(problem, rec.rows, head)
    return target[:, :seq], target, head


def decompose(
    problem: Problem, rec: Recording, settings: Settings, classifier: bool = True, layerwise: bool = False
) -> Decomposed:
    """DecompX on one recording (see :func:`decompx`); checks after every block that the parts
    sum to the next block's recorded input (and, with the head, that the head chain computes
    the model's logits), refusing the model otherwise."""
    adapter = problem.adapter
    roles = adapter.roles()
    family = adapter.family
    stored = adapter.word_embeddings.weight.dtype
    parts = initial_parts(rec, settings.aside)
    per_layer: list[torch.Tensor] = []
    last = len(rec.blocks) - 1
    found: tuple[torch.Tensor, torch.Tensor | None, HeadParts | None] | None = None
    anchors = rec.anchor[:, None]
    for layer, (block, block_rec) in enumerate(zip(roles.blocks, rec.blocks, strict=True)):
        only_anchors = layer == last and not layerwise
        parts = propagate(parts, block_rec, block, settings, anchors if only_anchors else None)
        real = rec.blocks[layer + 1].block_in if layer < last else block_rec.block_out
        if settings.ffn:
            computed = take(real, anchors) if only_anchors else real
            guard(parts.sum(dim=2), computed, None if only_anchors else rec.mask, family, f"block {layer}", stored)
        if layerwise or layer == last:
            found = _at_layer(problem, rec, roles, parts, real, classifier, settings, only_anchors)
            per_layer.append(found[0])
    assert found is not None
    _, target, head = found
    if head is not None:
        expected = rec.logits.gather(1, head.columns) if rec.logits.dim() == 2 else head.real
        guard(head.real, expected, None, family, "the head", stored)
        if settings.ffn:
            guard(head.parts.sum(dim=1), head.real, None, family, "the head's parts", stored)
    scores = torch.stack(per_layer, dim=1) if layerwise else per_layer[-1]
    return Decomposed(scores, target, head)


STATES = 5.0
"""``[N, N, D]`` tensors a DecompX decomposition keeps alive at once (the state, its values, the
next state, and the chunk's transients)."""


def scatter(problem: Problem, groups: Iterator[tuple[torch.Tensor, torch.Tensor]], layers: int | None) -> torch.Tensor:
    """Per-group scores ``(rows, [r, (L,) width])`` laid out as ``[B, N]`` (``[B, L, N]`` with
    ``layers``), 0 beyond each group's width."""
    out: torch.Tensor | None = None
    for rows, scores in groups:
        if out is None:
            out = scores.new_zeros(len(problem), *(() if layers is None else (layers,)), problem.batch.seq_len)
        out[rows, ..., : scores.shape[-1]] = scores
    assert out is not None
    return out


DECOMPX_COST = "2 forwards + O(L N^2 D (N + F)) decomposition; O(N^2 D) memory per layer (examples grouped under max_memory)"
"""The prediction's pass, one that records every block, and the propagation."""


@register("decompx", family="vector", cost=DECOMPX_COST, quantities=("logit",), needs=("roles", "head", "plain_blocks"))
@torch.no_grad()
def decompx(
    problem: Problem,
    *,
    include_biases: bool = True,
    bias_decomp: BiasRule = "absdot",
    include_ffn: bool = True,
    include_classifier: bool = True,
    layerwise: bool = False,
) -> torch.Tensor:
    """Each token's part of the target logit, the whole forward pass decomposed token by token.

    The state ``X [B, N, N, D]`` holds, for every position ``i``, the part ``X[i, k]`` of its
    residual-stream vector that comes from input token ``k``: ``X^0[i, k] = delta_ik x^0_i``
    (the embedding output), then block by block (Modarressi et al. 2023, Eq. 4-12):
    attention ``sum_h A_h[i, j] X[j, k] W_v^h W_O^h`` plus the residual ``X[i, k]``; each norm
    linearised at the token's own statistics, ``gamma * (X[i, k] - mean(X[i, k])) / s_i`` (RMSNorm:
    ``gamma * X[i, k] / rms_i``); the MLP's projections exactly and its activation by the
    zero-origin slope ``act(z) / z`` at the real pre-activation ``z`` (a gated MLP ``act(g) * u``
    shares each cross term evenly between its two factors); every bias ``b`` shared among the
    tokens by ``bias_decomp`` (``absdot``: ``|<X[i, k], b>| / sum_k' |<X[i, k'], b>|``, the
    reference's default). The head -- a pre-LN decoder's final norm, the pooler or classifier
    dense, its activation (tanh / GELU / ReLU by the same slope), the output projection --
    takes the anchor's parts to ``[B, N, C]``; the score of token ``k`` is its part of the
    target logit (a contrast: of the difference). With biases and the head the scores sum to
    the logit exactly (a guard refuses a model whose blocks do not add up).

    ``include_biases=False``: biases are no token's (their parts are dropped); ``include_ffn=False``:
    the MLPs' outputs are dropped (as the reference's option; the sum is then no longer the
    logit); ``include_classifier=False``: the norm ``||X^L[a, k]||`` of each token's part of the
    anchor's final representation instead. Returns ``[B, N]``, or ``[B, L, N]`` with
    ``layerwise=True`` (layer ``l``: the head applied to the decomposed output of block ``l``,
    a pre-LN decoder's final norm at that layer's statistics -- the logit lens, whose sum over
    tokens is LogAt's logit at the anchor).

    Families: every block the roles describe -- BERT, RoBERTa, ELECTRA, DistilBERT and DeBERTa-v2
    (relative attention changes only the probabilities, which the decomposition takes as they
    are; the values are linear in the input), GPT-2, OPT and the Llama family (RMSNorm is
    linear given its scale; the gated MLP as above). A DeBERTa-v2 model with a convolution after
    its first block (``conv_kernel_size > 0``) does not add up and is refused.

    Source: Modarressi et al. 2023, DecompX: Explaining Transformers Decisions by Propagating
    Token Decomposition (ACL); reference mohsenfayyaz/DecompX (src/modeling_bert.py)
    """
    settings = Settings(rule=bias_decomp, aside=not include_biases, ffn=include_ffn)
    layers = problem.adapter.num_layers if layerwise else None

    def groups() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for rec in recordings(problem, "decompx", STATES):
            yield rec.rows, decompose(problem, rec, settings, include_classifier, layerwise).scores

    return scatter(problem, groups(), layers)
