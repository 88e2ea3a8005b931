"""Attention-weight methods: raw attention and attention rollout."""

from __future__ import annotations

import torch

from heedful.engine.problem import Problem
from heedful.errors import InputError
from heedful.registry import register


def _anchor_rows(matrix: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Row ``anchor[b]`` of each ``[B, N, N]`` matrix -> ``[B, N]``."""
    return matrix[torch.arange(matrix.shape[0], device=matrix.device), anchor]


def _layer_index(layer: int, num_layers: int) -> int:
    if not -num_layers <= layer < num_layers:
        raise InputError(f"layer {layer} does not exist", hint=f"the model has {num_layers} layers (0..{num_layers - 1})")
    return layer % num_layers


@register("raw_attention", family="attention", cost="1 forward", needs_attentions=True, reads_logits=False)
@torch.no_grad()
def raw_attention(problem: Problem, *, layer: int = -1, head: int | None = None) -> torch.Tensor:
    """Attention from the explained position, averaged over heads, in one layer (last by default).

    ``mean_h A[layer][h, a, :]`` for the anchor row ``a`` (the [CLS] / last token) ``[B, N]``.

    ``layer``: 0-based, negative from the end (default the last); ``head`` picks one head
    instead of the mean.

    Source: Attention weights as explanation (e.g. Jain & Wallace 2019; Mask-LRP's RawAtt baseline)
    """
    attentions = problem.reference_with(attentions=True).attentions
    attn = attentions[_layer_index(layer, len(attentions))]  # [B, H, N, N]
    if head is not None:
        if not 0 <= head < attn.shape[1]:
            raise InputError(f"head {head} does not exist", hint=f"the model has {attn.shape[1]} heads")
        per_layer = attn[:, head]
    else:
        per_layer = attn.mean(dim=1)
    return _anchor_rows(per_layer, problem.anchor)


@register("rollout", family="attention", cost="1 forward", needs_attentions=True, needs=("attention_flow",), reads_logits=False)
@torch.no_grad()
def rollout(problem: Problem, *, start_layer: int = 0) -> torch.Tensor:
    """Head-averaged attention plus identity, row-normalised, multiplied through the layers.

    ``R = Abar_L ... Abar_start`` with ``Abar_l = norm_rows(mean_h A_l + I)``; anchor row ``[B, N]``.

    Source: Abnar & Zuidema 2020, Quantifying Attention Flow in Transformers (attention rollout, Eq.
    1)
    """
    attentions = problem.reference_with(attentions=True).attentions
    start = _layer_index(start_layer, len(attentions))
    seq = attentions[0].shape[-1]
    eye = torch.eye(seq, dtype=attentions[0].dtype, device=attentions[0].device)
    joint = None
    for attn in attentions[start:]:
        a = attn.mean(dim=1) + eye
        a = a / a.sum(dim=-1, keepdim=True)
        joint = a if joint is None else a @ joint
    return _anchor_rows(joint, problem.anchor)
