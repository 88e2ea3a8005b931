"""Relevance-propagation methods: LRP, PartialLRP, Chefer's transformer attribution, AttnLRP,
Mask-LRP, and the attention-gradient baselines of the Mask-LRP paper (CAM, GradCAM).

The LRP rules live in :mod:`heedful.lrp` and are attached to the model by the adapter's roles;
nothing here knows an architecture. Rollout-style scores are the anchor's row (the [CLS] token
of an encoder classifier, the last token of a decoder, the [MASK] of a masked LM) with the
anchor's own entry set to 0, as in the reference implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import torch

from heedful.adapters import ModelAdapter
from heedful.attribution.attention_gradient import (
    attention_gradients,
    attention_reference,
    mean_over_real_rows,
)
from heedful.engine.batch import Batch
from heedful.engine.chunks import length_chunks
from heedful.engine.memory import Need, require
from heedful.engine.options import KEYED_WHEN_SET, OPEN_UNIT, UNIT
from heedful.engine.problem import Problem
from heedful.errors import InputError
from heedful.lrp import rule_set
from heedful.lrp.masks import Ablation
from heedful.lrp.propagate import LRPForward, Prepared, RelevancePass, lrp_backward, lrp_forward
from heedful.lrp.rules import MASK_VARIANTS, MaskVariant
from heedful.registry import register

RELPROP_COST = "1 forward + 1 backward + 1 relevance pass"

HeadsMean = Literal["kept", "all"]
"""Song et al. 2024 Eq. 10's ``E_h`` under a head mask: the mean over the block's kept heads, or
over all its heads with the cut heads contributing 0."""


def lrp_reference(rules: str) -> Callable[..., LRPForward]:
    """A reference pass (see :class:`~heedful.registry.MethodInfo`) that is the LRP forward of
    ``rules`` itself, run in groups of rows of similar length, each cut to its longest row: the
    method then needs no forward of its own. Their graphs, all kept, must fit the adapter's
    ``max_memory`` (:func:`heedful.engine.memory.require`: an :class:`InputError` before any work)."""

    def reference(
        adapter: ModelAdapter, batch: Batch, anchor: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> LRPForward:
        planned = length_chunks(batch.lengths)
        # every chunk's graph is kept for the relevance pass; the rules run eager attention
        need = Need(grad="saved", eager=True, hidden_states=adapter.task in ("masked_lm", "causal_lm"))
        require(adapter.shape, adapter.max_memory, [(len(rows), width) for rows, width in planned], need)
        chunks = [lrp_forward(adapter, batch, anchor, rule_set(rules), rows, width, inputs_embeds) for rows, width in planned]
        order = torch.argsort(torch.cat([c.rows for c in chunks]))
        return LRPForward(logits=torch.cat([c.logits for c in chunks])[order], rules=rules, chunks=chunks)

    reference.__name__ = f"lrp_reference_{rules}"
    return reference


def _passes(problem: Problem, rules: str, **options: Any) -> Iterator[tuple[Prepared, RelevancePass]]:
    """The backward passes of ``rules`` on each length chunk, reusing the problem's reference
    pass when it is the LRP forward of the same rules."""
    reference, target = problem.reference, problem.target
    if isinstance(reference, LRPForward) and reference.rules == rules and reference.chunks:
        chunks = reference.chunks
    else:
        chunks = lrp_reference(rules)(problem.adapter, problem.batch, target.read_at, problem.inputs_embeds).chunks
    for chunk in chunks:
        yield chunk, lrp_backward(chunk, problem.adapter, target.select(chunk.rows), **options)


def _scatter(batch: Batch, parts: list[tuple[Prepared, torch.Tensor]]) -> torch.Tensor:
    """Per-chunk scores ``[R, W]`` back into one ``[B, N]`` tensor (zeros beyond each row's chunk)."""
    out = torch.zeros(batch.input_ids.shape, dtype=parts[0][1].dtype, device=parts[0][1].device)
    for chunk, scores in parts:
        out[chunk.rows, : chunk.width] = scores.to(out.dtype)
    return out


def _anchor_row(matrix: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Row ``anchor[b]`` of ``[B, N, N]`` with its self-entry set to 0 -> ``[B, N]``."""
    rows = torch.arange(matrix.shape[0], device=matrix.device)
    scores = matrix[rows, anchor].clone()
    scores[rows, anchor] = 0.0
    return scores


def _start_layer(start_layer: int, layers: int) -> int:
    if not -layers <= start_layer < layers:
        raise InputError(f"start_layer {start_layer} does not exist", hint=f"the model has {layers} layers (0..{layers - 1})")
    return start_layer % layers


def relevance_rollout(maps: list[torch.Tensor], start_layer: int = 0) -> torch.Tensor:
    """Chefer 2021a Eq. 13-14 (``compute_rollout_attention``): ``M_l = norm_rows(Abar_l + I)``,
    ``C = M_L ... M_start`` for per-layer maps ``Abar_l`` ``[B, N, N]`` -> ``[B, N, N]``."""
    eye = torch.eye(maps[0].shape[-1], dtype=maps[0].dtype, device=maps[0].device)
    joint = None
    for cam in maps[start_layer:]:
        m = cam + eye
        m = m / m.sum(dim=-1, keepdim=True)
        joint = m if joint is None else m @ joint
    return joint


def _weighted_maps(
    grads: list[torch.Tensor], maps: dict[int, torch.Tensor], heads: torch.Tensor | None = None, heads_mean: str = "kept"
) -> list[torch.Tensor]:
    """``Abar_l = mean_h (grad A_l * R_A_l)^+`` per layer ``[B, N, N]`` (``grads``, ``maps``:
    ``[B, H, N, N]`` per layer). With ``heads`` ``[L, H]`` (0/1) only layer ``l``'s kept heads
    enter (Song et al. 2024 Eq. 10), divided by their number ``|K_l|`` (``heads_mean="kept"``; a
    layer that keeps none gives ``Abar_l = 0``) or by all ``H`` heads, the cut ones counted as 0
    (``"all"``)."""
    if heads is None:
        return [(g * maps[layer]).clamp(min=0).mean(dim=1) for layer, g in enumerate(grads)]
    if heads_mean == "all":
        weights = heads / heads.shape[1]  # [L, H]: 1/H on kept heads, 0 on cut ones
    else:
        weights = heads / heads.sum(dim=1, keepdim=True).clamp(min=1)  # [L, H]: 1/|K_l| on kept heads
    kept = [(g * maps[layer]).clamp(min=0) for layer, g in enumerate(grads)]  # float32 maps: float32 products
    return [torch.einsum("bhij,h->bij", k, weights[layer].to(k)) for layer, k in enumerate(kept)]


def lrp_method(rules: str) -> dict:
    """What every LRP method registers with: LRP rules explain logits (their relevance is
    conserved for them), and the method needs the block roles and the family's ``rules``."""
    return {"family": "relevance", "quantities": ("logit",), "needs": ("roles", "rules", f"rules.{rules}")}



@register("lrp", **lrp_method("lrp"), cost="1 forward + 1 relevance pass", reference=lrp_reference("lrp"))
def lrp(problem: Problem, *, rules: Literal["lrp", "chefer"] = "lrp") -> torch.Tensor:
    """Relevance of each token's input to the first block, propagated from the target logit (sums to 1).

    Full LRP: ``R`` at the first block's input, summed over the hidden dimension ``[B, N]``.

    Starts from ``R = 1`` on the explained logit (contrast targets: +1 / -1) and conserves it
    (the scores sum to the seed). ``rules="lrp"`` (default): alpha=1, beta=0 linears, halved
    z-rule products, identity non-linearities, plain z-rule additions -- the "LRP" baseline of
    Chefer et al. 2021a and Song et al. 2024; ``rules="chefer"``: renormalised additions.

    Source: Bach et al. 2015, Layer-wise Relevance Propagation (Eq. 2, alpha1-beta0 / z-rules) with
    Chefer et al. 2021a's transformer rules (original-LRP additions, their layers_lrp.py)
    """
    parts = [(c, p.inputs.sum(dim=-1)) for c, p in _passes(problem, rules)]
    return _scatter(problem.batch, parts)


@register("partial_lrp", **lrp_method("lrp"), cost="1 forward + 1 relevance pass (last layer)", reference=lrp_reference("lrp"))
def partial_lrp(problem: Problem) -> torch.Tensor:
    """Positive LRP relevance of the last layer's attention probabilities, averaged over heads, anchor row.

    ``mean_h (R_A_L)^+[anchor, :]`` with the anchor's self-entry 0 ``[B, N]``; ``R_A_L``: the
    relevance of the last layer's attention probabilities under the original LRP rules.

    Source: Voita et al. 2019, Analyzing Multi-Head Self-Attention (relevance of heads, Sec. 4), as
    the PartialLRP baseline of Chefer et al. 2021a / Song et al. 2024
    """
    parts = []
    for chunk, found in _passes(problem, "lrp", maps=True, inputs=False, last_layer_only=True):
        last = found.maps[max(found.maps)]
        parts.append((chunk, _anchor_row(last.clamp(min=0).mean(dim=1), problem.anchor[chunk.rows])))
    return _scatter(problem.batch, parts)


@register("chefer", **lrp_method("chefer"), cost=RELPROP_COST, reference=lrp_reference("chefer"))
def chefer(problem: Problem, *, start_layer: int = 0) -> torch.Tensor:
    """LRP relevance of attention maps weighted by their gradients, positive part, rolled out over the layers.

    ``Abar_l = mean_h (grad A_l * R_A_l)^+``, ``C = prod_l norm_rows(Abar_l + I)`` from
    ``start_layer`` (0 = all layers; the reference default 11 = last layer of BERT-base); the
    anchor row of ``C`` with its self-entry 0 ``[B, N]``.

    Source: Chefer, Gur & Wolf 2021a, Transformer Interpretability Beyond Attention Visualization
    (Eq. 13-14; ExplanationGenerator.generate_LRP)
    """
    return _rollout_scores(problem, start_layer)


def _rollout_scores(
    problem: Problem, start_layer: int, kept_heads: torch.Tensor | None = None, heads_mean: str = "kept", **options: Any
) -> torch.Tensor:
    """Chefer's rollout of ``mean_h (grad A * R_A)^+`` per chunk (with ``kept_heads`` ``[L, H]``
    only those heads enter, the mean as ``heads_mean`` says, :func:`_weighted_maps`), anchor rows
    ``[B, N]``."""
    parts = []
    for chunk, found in _passes(problem, "chefer", gradients=True, maps=True, inputs=False, **options):
        start = _start_layer(start_layer, len(found.probs))
        joint = relevance_rollout(_weighted_maps(found.attn_grads, found.maps, kept_heads, heads_mean), start)
        parts.append((chunk, _anchor_row(joint, problem.anchor[chunk.rows])))
    return _scatter(problem.batch, parts)


@register(
    "mask_lrp",
    **lrp_method("chefer"),
    cost=RELPROP_COST + " (+ head statistics once per model)",
    reference=lrp_reference("chefer"),
    version=2,
)
def mask_lrp(
    problem: Problem,
    *,
    head_mask: Any = None,
    variant: MaskVariant = "literal",
    start_layer: int = 0,
    reference_scale: bool = True,
    xi_synt: Annotated[float, UNIT] = 0.1,
    xi_pos: Annotated[float, OPEN_UNIT] = 0.8,
    ablation: Ablation | None = None,
    ablation_seed: int = 0,
    corruption_rate: Annotated[float, UNIT] = 0.1,
    heads_mean: Annotated[HeadsMean, KEYED_WHEN_SET] = "kept",
) -> torch.Tensor:
    """Chefer's rollout of the relevance that flows through selected syntactic and positional heads.

    Mask-LRP: the head mask ``M`` ``[L, H]`` (Eq. 6-8) multiplies each head's output relevance
    ``R^(n_b - 1)`` before it enters ``A V`` in the relevance pass only (the forward and the
    gradients are the model's); cut heads pass nothing to ``A``, ``Q``, ``K``, ``V``. Then the
    rollout ``C = prod_b norm_rows(Abar_b + I)`` (Eq. 11) from ``start_layer``; the anchor row of
    ``C`` with its self-entry 0 ``[B, N]``.

    ``variant="literal"`` (default; Sec. 4.3 as written): in block ``b``
    ``R^(n_b) = G(A, V, M_b R^(n_b - 1))`` (Eq. 9: the relevance of ``A`` and ``V`` from the kept
    heads, ``R_synt + R_pos``) is renormalised, per example, to
    ``R^(n_b) * sum R^(n_b - 1) / sum R^(n_b)`` -- the paper's normalisation, which it states
    "ensures the conservation rule", ``sum R_synt + sum R_pos = sum R^(n_b - 1)``. The sums run
    over the relevance entering and leaving the masked step, so the renormalisation sits in the
    ``A V`` backward where the mask acts: the kept heads carry on what all heads received, the
    residual split before it is untouched, and every block conserves relevance (Eq. 3). (The
    paper normalises ``R_synt`` and ``R_pos`` separately with Chefer's ``|sum|`` shares; when the
    two sums share a sign, as they do for a one-hot seed, both factors equal the one used here, and
    a head both syntactic and positional is counted once.) A block that keeps no head has nothing
    to renormalise (``0 / 0``); its attention residual then sends all relevance to the skip path,
    the only way left to conserve it. Eq. 10: ``Abar_b = mean_{h in K_b} (grad A_b^h * R_A_b^h)^+``
    over the kept heads ``K_b`` only, with ``R_A`` the renormalised relevance of ``A``
    (``Abar_b = 0`` when ``K_b`` is empty). A mask of ones is :func:`chefer` exactly.

    ``heads_mean`` (literal variant only) is a reading of Eq. 10's ``E_h``, which the paper does
    not spell out under a mask: ``"kept"`` (default) divides by ``|K_b|``; ``"all"`` takes the
    mean over all ``H`` heads of the block, the cut heads contributing 0 (their ``R_A`` is 0), so
    ``Abar_b = (|K_b| / H) mean_{h in K_b} (...)^+``: a block keeping few heads moves the rollout
    less. Both agree for a mask of ones and for blocks that keep every head.

    ``variant="reference"`` (the authors' code, ExplanationGenerator.MGAE): no renormalisation --
    the cut heads' relevance is lost, blocks do not conserve; the map used for the rollout is
    ``R_A`` from the *unmasked* head relevance ``R^(n_b - 1)`` (``reference_scale`` True, their
    code: without the 1/2 of the product rule; False halves it as in :func:`chefer`), averaged over
    all heads, ``Abar_b = mean_h (grad A_b * R_A_b)^+``. A mask of ones reproduces :func:`chefer`
    exactly with ``reference_scale=False``; with ``True`` every layer's map is doubled.
    ``reference_scale`` applies to this variant only.

    ``head_mask``: a :class:`~heedful.lrp.masks.HeadMask`, a path to one saved by ``heedful
    heads``, or a ``[L, H]`` 0/1 array; default: the model's cached mask, computed the first time
    from the movie-review train split (``xi_synt``, ``xi_pos`` are Eq. 7-8's thresholds). A path or
    nested list keeps explanations JSON-serialisable.

    Ablations of the paper (Table 1 "Random", Table 3, Figure 4) apply to the mask:
    ``ablation="random"`` (same number of heads, ``ablation_seed``), ``"corrupted"``
    (``corruption_rate`` of the unselected heads switched on), ``"no_positional"``,
    ``"no_syntactic"``.

    Source: Song et al. 2024, Better Explain Transformers by Illuminating Important Information (Eq.
    6-11; Mask-LRP ExplanationGenerator.MGAE)
    """
    from heedful.lrp.heads import default_head_mask
    from heedful.lrp.masks import ablate, as_head_mask

    if variant not in MASK_VARIANTS:
        raise InputError(f"unknown Mask-LRP variant {variant!r}", hint="use one of: " + ", ".join(MASK_VARIANTS))
    if variant == "literal" and not reference_scale:
        raise InputError("reference_scale applies to variant='reference' only", hint="drop it, or pass variant='reference'")
    if variant == "reference" and heads_mean != "kept":
        raise InputError(
            "heads_mean applies to variant='literal' only",
            hint="the authors' code already averages every head's unmasked map; drop heads_mean or pass variant='literal'",
        )
    adapter = problem.adapter
    adapter.lrp_roles("chefer")  # an unmapped family fails here, before any head statistics are computed
    mask = default_head_mask(adapter, xi_synt=xi_synt, xi_pos=xi_pos) if head_mask is None else as_head_mask(head_mask)
    if ablation is not None:
        mask = ablate(mask, ablation, ablation_seed, corruption_rate)
    heads = torch.as_tensor(mask.as_float(), device=adapter.device)
    return _rollout_scores(
        problem,
        start_layer,
        kept_heads=heads if variant == "literal" else None,
        heads_mean=heads_mean,
        head_mask=heads,
        mask_variant=variant,
        reference_scale=reference_scale,
    )


@register("attnlrp", **lrp_method("attnlrp"), cost="1 forward + 1 backward", reference=lrp_reference("attnlrp"), spans=True)
def attnlrp(problem: Problem) -> torch.Tensor:
    """AttnLRP relevance of each word embedding (one modified backward pass), summed over the embedding.

    ``sum_d e_id * g_id`` with ``g`` the AttnLRP-modified gradient of the target logit at the
    word embeddings ``e`` ``[B, N]``; the scores sum to the logit minus what biases absorb. A
    span target (``quantity="logit"``) is the sum of its tokens' logits in one backward pass,
    as LXT's answer to multi-token targets has it.

    Source: Achtibat et al. 2024, AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
    Transformers (Eq. 7, 9, 13; lxt.efficient rules)
    """
    parts = [(c, p.inputs.sum(dim=-1)) for c, p in _passes(problem, "attnlrp")]
    return _scatter(problem.batch, parts)


@register("cam", family="relevance", cost="1 forward + 1 backward", reference=attention_reference(), needs=("attentions", "attention_flow"))
def cam(problem: Problem) -> torch.Tensor:
    """Last layer's attention gradient averaged over heads and query rows, positive part.

    ``max(0, mean_{h,i} dF/dA_L[h, i, :])`` over real query rows, anchor column 0 ``[B, N]``.

    Source: Zhou et al. 2016 (CAM) on attention gradients, as the CAM baseline of Song et al. 2024
    (Mask-LRP ExplanationGenerator.generate_gradcam)
    """
    _, grads, _ = attention_gradients(problem)
    scores = mean_over_real_rows(grads[-1].mean(dim=1), problem.batch.attention_mask).clamp(min=0)
    scores[torch.arange(scores.shape[0], device=scores.device), problem.anchor] = 0.0
    return scores


@register(
    "attention_gradcam",
    family="relevance",
    cost="1 forward + 1 backward",
    reference=attention_reference(),
    needs=("attentions", "attention_flow"),
)
def attention_gradcam(problem: Problem) -> torch.Tensor:
    """Last layer's attention weighted per head by its mean gradient, positive part, min-max normalised.

    ``w_h = mean_{i,j} dF/dA_L[h]``; ``G = max(0, mean_h w_h A_L[h])`` min-max normalised over
    the real ``N x N`` block; anchor row with self-entry 0 ``[B, N]``. (Grad-SAM proper is
    ``grad_sam``.)

    Source: Chefer et al. 2021a's GradCAM-on-attention baseline, as GradCAM in Song et al. 2024
    (ExplanationGenerator.generate_attn_gradcam)
    """
    fwd, grads, _ = attention_gradients(problem)
    attn, grad = fwd.attentions[-1], grads[-1]
    real = problem.batch.attention_mask.to(attn.dtype)
    cells = (real[:, :, None] * real[:, None, :])[:, None]  # [B, 1, N, N]
    weights = (grad * cells).sum(dim=(-1, -2), keepdim=True) / cells.sum(dim=(-1, -2), keepdim=True)
    maps = (weights * attn).mean(dim=1).clamp(min=0)  # [B, N, N]
    inside = cells[:, 0].bool()
    big = torch.finfo(maps.dtype).max
    low = maps.masked_fill(~inside, big).amin(dim=(-1, -2), keepdim=True)
    high = maps.masked_fill(~inside, -big).amax(dim=(-1, -2), keepdim=True)
    maps = torch.where(inside, (maps - low) / (high - low).clamp(min=1e-12), torch.zeros_like(maps))
    return _anchor_row(maps, problem.anchor)
