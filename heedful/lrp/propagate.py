"""Forward under a rule set, then the backward passes a relevance method asks for.

:func:`lrp_forward` runs (part of) a batch forward inside an :class:`LRPSession` and keeps the
graph; :func:`lrp_backward` then runs, on that graph, whichever of these were requested:

* ``attn_grads``: ``dF/dA_l`` ``[R, H, W, W]`` per layer (the ordinary gradient; relevance-form
  rules only, from the same graph);
* ``maps``: relevance of the attention probabilities ``R_A_l`` ``[R, H, W, W]`` per layer;
* ``inputs``: input relevance ``[R, W, D]`` -- at the first block's input for relevance-form
  rules (Chefer), ``e * g`` at the word embeddings for AttnLRP;
* ``blocks``: relevance at every block's input and at the last block's output, ``L + 1``
  tensors ``[R, W, D]`` (for conservation checks: block ``l`` maps ``blocks[l + 1]`` to
  ``blocks[l]``).

The split lets a method's *reference pass* (the forward every method needs to resolve its
target) be the LRP forward itself, as the gradient methods do. :func:`propagate` does both
steps on a whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.engine.batch import Batch
from heedful.engine.precision import widened
from heedful.engine.targets import ResolvedTarget
from heedful.errors import InputError, UnsupportedModelError
from heedful.lrp.functions import GRADIENT, RELEVANCE
from heedful.lrp.rules import RuleSet
from heedful.lrp.session import LRPSession


@dataclass
class RelevancePass:
    """What :func:`lrp_backward` found for the rows of one :class:`Prepared` chunk."""

    score: torch.Tensor
    probs: list[torch.Tensor]
    attn_grads: list[torch.Tensor] | None = None
    maps: dict[int, torch.Tensor] | None = None
    inputs: torch.Tensor | None = None
    blocks: list[torch.Tensor] | None = None


@dataclass
class Prepared:
    """Rows ``rows`` of a batch, cut to ``width`` positions, run forward under ``session``'s
    rules with the graph kept. ``logits`` ``[R, C]`` are the model's head outputs (for target
    resolution); ``feats`` ``[R, E]`` the input of a language-model head's vocabulary projection."""

    session: LRPSession
    rows: torch.Tensor
    width: int
    embeds: torch.Tensor
    logits: torch.Tensor
    feats: torch.Tensor | None = None


@dataclass
class LRPForward(Forward):
    """A reference pass that is the LRP forward of ``rules`` (see :func:`lrp_forward`), in
    length chunks ``chunks``."""

    rules: str = ""
    chunks: list[Prepared] = field(default_factory=list)


def lrp_forward(
    adapter: ModelAdapter,
    batch: Batch,
    anchor: torch.Tensor,
    rules: RuleSet,
    rows: torch.Tensor | None = None,
    width: int | None = None,
    inputs_embeds: torch.Tensor | None = None,
) -> Prepared:
    """Forward of rows ``rows`` (default all) cut to ``width`` positions (default all) under
    ``rules``, from the batch's word embeddings or ``inputs_embeds`` ``[B, N, E]``."""
    rows = torch.arange(len(batch)) if rows is None else rows
    width = batch.input_ids.shape[1] if width is None else width
    lm = adapter.task in ("masked_lm", "causal_lm")
    types = None if batch.token_type_ids is None else batch.token_type_ids[rows, :width]
    session = LRPSession(adapter, rules)
    with session, torch.enable_grad():
        start = adapter.embed(batch.input_ids[rows, :width]) if inputs_embeds is None else inputs_embeds[rows, :width]
        embeds = start.detach()
        if not rules.relevance_form:
            embeds.requires_grad_(True)
        fwd = adapter.forward(
            batch,
            anchor[rows],
            inputs_embeds=embeds,
            attention_mask=batch.attention_mask[rows, :width],
            token_type_ids=types,
            hidden_states=lm,
        )
        feats = None
        if lm:
            parts = adapter.lm_head_parts()
            if parts is None:
                raise UnsupportedModelError(
                    f"the {adapter.family} language-model head has no linear projection to propagate through"
                )
            last = fwd.hidden_states[-1]
            index = torch.arange(last.shape[0], device=last.device)
            at = anchor[rows].to(last.device)
            feats = parts.transform(last[index[:, None] if at.dim() == 2 else index, at])  # [R, E] or, a span, [R, K, E]
    return Prepared(session, rows, width, embeds, fwd.logits, feats)


def explained_score(prepared: Prepared, adapter: ModelAdapter, target: ResolvedTarget) -> torch.Tensor:
    """The explained scalar per row ``[R]`` (``target`` restricted to the chunk's rows).

    Classifier and regression heads ran as modules (their rules attached by role); a
    language-model head's target columns go through the rule set's :meth:`~RuleSet.project`.
    """
    if target.quantity != "logit":
        raise InputError(
            f"LRP explains logits (its relevance is conserved for them), not a {target.quantity}",
            hint="pass quantity='logit' (a span then explains the sum of its tokens' logits)",
        )
    if prepared.feats is None:
        return target.score(prepared.logits)
    parts = adapter.lm_head_parts()
    columns = target.classes.to(prepared.feats.device)
    feats = prepared.feats
    if feats.dim() == 3:  # a span: column k read at the k-th position, one column per row of [R*K]
        rows, span = columns.shape
        feats, columns = feats.reshape(rows * span, -1), columns.reshape(rows * span, 1)
    bias = None if parts.bias is None else parts.bias[columns]
    with torch.enable_grad():
        logits = prepared.session.rules.project(prepared.session.state, feats, parts.weight[columns], bias)
        if parts.softcap is not None:
            logits = prepared.session.rules.cap(prepared.session.state, logits, parts.softcap)
    logits = logits.reshape(target.classes.shape)
    return (logits * target.weights.to(logits)).sum(dim=1)


def lrp_backward(
    prepared: Prepared,
    adapter: ModelAdapter,
    target: ResolvedTarget,
    *,
    head_mask: torch.Tensor | None = None,
    mask_variant: str = "literal",
    reference_scale: bool = True,
    gradients: bool = False,
    maps: bool = False,
    inputs: bool = True,
    blocks: bool = False,
    last_layer_only: bool = False,
) -> RelevancePass:
    """The backward passes on a :class:`Prepared` chunk (see the module docstring).

    ``target`` is restricted to the chunk's rows. ``head_mask`` ``[L, H]`` (Mask-LRP) scales each
    head's output relevance in the relevance pass, as ``mask_variant`` says (``"literal"``: the
    kept heads' relevance renormalised, Song et al. 2024 Eq. 9-10; ``"reference"``: their code;
    see :class:`~heedful.lrp.rules.RelevanceState`). ``last_layer_only`` stops the relevance pass at
    the last layer's attention probabilities (enough for its ``maps`` when neither ``inputs`` nor
    ``blocks`` are asked for).
    """
    session, rules, state = prepared.session, prepared.session.rules, prepared.session.state
    rows = len(prepared.rows)
    layers = len(session.probs)
    if head_mask is not None:
        head_mask = torch.as_tensor(head_mask, dtype=torch.float32, device=session.probs[0].device)
        heads = session.probs[0].shape[1]
        if tuple(head_mask.shape) != (layers, heads):
            raise InputError(
                f"head mask has shape {tuple(head_mask.shape)}; the model has {layers} layers x {heads} heads",
                hint="compute the mask for this model (heedful heads --model ...)",
            )
    state.head_mask = head_mask
    state.mask_variant = mask_variant
    state.reference_scale = reference_scale
    state.keep_maps = maps
    state.maps = {}
    recorded = session.probs
    probs = [recorded[i] for i in range(layers)]
    with torch.enable_grad():
        score = explained_score(prepared, adapter, target)
        total = score.sum()
        result = RelevancePass(score=score.detach(), probs=[p.detach() for p in probs])
        if gradients:
            if not rules.relevance_form:
                raise ValueError("attention gradients come with relevance-form rules only")
            state.mode = GRADIENT
            adapter.counter.backward += rows
            result.attn_grads = list(torch.autograd.grad(total, probs, retain_graph=True))
        state.mode = RELEVANCE
        inputs_seen = session.block_inputs
        start = inputs_seen[0] if rules.relevance_form else prepared.embeds
        stages = [inputs_seen[i] for i in range(layers)] + [session.last_output]
        wanted: list[torch.Tensor] = ([start] if inputs else []) + (stages if blocks else [])
        if not wanted:
            wanted = [probs[-1] if last_layer_only else probs[0]]
        adapter.counter.backward += rows
        found = list(torch.autograd.grad(total, wanted, allow_unused=True))
    found = [torch.zeros_like(w) if g is None else g for w, g in zip(wanted, found, strict=True)]
    if not rules.relevance_form:
        found = [widened(w) * widened(g) for w, g in zip(wanted, found, strict=True)]
    found = [g.detach() for g in found]
    if inputs:
        result.inputs = found.pop(0)
    if blocks:
        result.blocks = found
    if maps:
        result.maps = dict(state.maps)
    return result


def propagate(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    rules: RuleSet,
    **options,
) -> RelevancePass:
    """:func:`lrp_forward` then :func:`lrp_backward` on the whole (padded) batch."""
    prepared = lrp_forward(adapter, batch, target.read_at, rules)
    return lrp_backward(prepared, adapter, target, **options)
