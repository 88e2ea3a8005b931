"""Methods that weigh attention probabilities by their gradients: GAE, Grad-SAM, AttCAT.

All need one forward with attention probabilities kept in the graph and one backward of the
target logit to every layer's attention map (and hidden states for AttCAT).
"""

from __future__ import annotations

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.engine.batch import Batch
from heedful.engine.memory import Need, require
from heedful.engine.problem import Problem
from heedful.registry import register


def attention_reference(hidden: bool = False):
    """A reference pass (see :class:`heedful.registry.MethodInfo`) that keeps attentions (and,
    with ``hidden``, hidden states) in the autograd graph, so the method's backward needs no
    forward of its own. The pass must fit the adapter's ``max_memory``
    (:func:`heedful.engine.memory.require`: an :class:`InputError` before any work)."""

    def reference(
        adapter: ModelAdapter, batch: Batch, anchor: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> Forward:
        need = Need(grad="saved", attentions=True, hidden_states=hidden)
        require(adapter.shape, adapter.max_memory, [(len(batch), batch.seq_len)], need)
        start = adapter.embed(batch.input_ids) if inputs_embeds is None else inputs_embeds
        embeds = start.detach().requires_grad_(True)
        with torch.enable_grad():
            fwd = adapter.forward(batch, anchor, inputs_embeds=embeds, attentions=True, hidden_states=hidden)
        return Forward(fwd.logits, fwd.hidden_states, fwd.attentions, inputs_embeds=embeds)

    return reference


def attention_gradients(
    problem: Problem, hidden: bool = False
) -> tuple[Forward, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """``dF/dA_l`` ``[B, H, N, N]`` per layer and ``dF/dh_l`` ``[B, N, D]`` for
    ``hidden_states[0..L-1]`` (empty unless ``hidden``), by one backward of the target.

    Back-propagates through the problem's reference pass when it kept its graph
    (:func:`attention_reference`), otherwise runs a forward of its own first. Returns the
    (detached) forward and the gradients.
    """
    adapter, batch, target, reference = problem.adapter, problem.batch, problem.target, problem.reference
    kept = (
        reference.inputs_embeds is not None
        and reference.attentions is not None
        and (reference.hidden_states is not None or not hidden)
    )
    if kept:
        fwd = reference
    else:
        fwd = attention_reference(hidden)(adapter, batch, target.anchor, problem.inputs_embeds)
    with torch.enable_grad():
        wrt = list(fwd.attentions) + (list(fwd.hidden_states[:-1]) if hidden else [])
        adapter.counter.backward += len(batch)
        grads = torch.autograd.grad(target.score(fwd.logits).sum(), wrt)
    layers = len(fwd.attentions)
    detached = Forward(
        fwd.logits.detach(),
        tuple(h.detach() for h in fwd.hidden_states) if hidden else None,
        tuple(a.detach() for a in fwd.attentions),
    )
    return detached, grads[:layers], grads[layers:]


def mean_over_real_rows(matrix: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real query rows of ``[B, N, N]`` -> ``[B, N]`` (padding rows excluded)."""
    weights = mask.to(matrix.dtype)
    return (matrix * weights[:, :, None]).sum(dim=1) / weights.sum(dim=1, keepdim=True)


@register("gae", family="relevance", cost="1 forward + 1 backward", reference=attention_reference(), needs=("attentions", "attention_flow"))
def gae(problem: Problem) -> torch.Tensor:
    """Gradient-weighted attention, positive part, accumulated through the layers (R += Abar R).

    ``Abar_l = mean_h (grad A_l * A_l)^+``; ``R = I``; ``R <- R + Abar_l R`` for each layer in
    forward order; the anchor row of ``R`` with its self-entry set to 0 ``[B, N]``.

    Source: Chefer et al. 2021b, Generic Attention-model Explainability (Eq. 5-6)
    """
    fwd, grads, _ = attention_gradients(problem)
    bsz, seq = problem.batch.input_ids.shape
    relevance = torch.eye(seq, dtype=fwd.attentions[0].dtype, device=fwd.attentions[0].device).expand(bsz, seq, seq).clone()
    for attn, grad in zip(fwd.attentions, grads, strict=True):
        weighted = (grad * attn).clamp(min=0).mean(dim=1)
        relevance = relevance + weighted @ relevance
    rows = torch.arange(bsz, device=relevance.device)
    scores = relevance[rows, problem.anchor].clone()
    scores[rows, problem.anchor] = 0.0
    return scores


@register("grad_sam", family="relevance", cost="1 forward + 1 backward", reference=attention_reference(), needs=("attentions", "attention_flow"))
def grad_sam(problem: Problem) -> torch.Tensor:
    """Attention times ReLU of its gradient, averaged over layers, heads and query rows.

    ``s_j = mean_{l,h,i} A_l[h,i,j] * ReLU(dF/dA_l[h,i,j])`` over real query rows ``i`` ``[B, N]``.

    Source: Barkan et al. 2021, Grad-SAM: Explaining Transformers via Gradient Self-Attention Maps
    (Eq. 2-3)
    """
    fwd, grads, _ = attention_gradients(problem)
    maps = torch.stack([(a * g.clamp(min=0)).mean(dim=1) for a, g in zip(fwd.attentions, grads, strict=True)])
    return mean_over_real_rows(maps.mean(dim=0), problem.batch.attention_mask)


@register(
    "attcat",
    family="relevance",
    cost="1 forward + 1 backward",
    reference=attention_reference(hidden=True),
    needs=("attentions", "hidden_states", "attention_flow"),
)
def attcat(problem: Problem) -> torch.Tensor:
    """Per layer: gradient x hidden state of each token, weighted by the attention it receives; summed over layers.

    ``AttCAT_j = sum_l (sum_d dF/dh_l[j,d] * h_l[j,d]) * mean_{h,i} A_l[h,i,j]`` with ``h_l`` the
    input of block ``l`` and the mean over heads and real query rows ``[B, N]`` (signed).

    Source: Qiang et al. 2022, AttCAT: Explaining Transformers via Attentive Class Activation Tokens
    (Eq. 6-7)
    """
    fwd, attn_grads, hidden_grads = attention_gradients(problem, hidden=True)
    batch = problem.batch
    total = torch.zeros(batch.input_ids.shape, device=fwd.attentions[0].device)
    for layer, (attn, grad_h) in enumerate(zip(fwd.attentions, hidden_grads, strict=True)):
        cat = (grad_h * fwd.hidden_states[layer]).sum(dim=-1)
        received = mean_over_real_rows(attn.mean(dim=1), batch.attention_mask)
        total = total + cat * received
    return total
