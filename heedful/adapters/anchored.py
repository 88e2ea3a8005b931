"""The last block at the anchor positions only: a forward-only pass whose head reads one position.

A classifier reads one position of the last block's output (BERT's ``[CLS]``). Every position
of the blocks below feeds that position's keys and values, but in the last block only the
anchor's own query, attention output and MLP are read. Post-LN encoder blocks (BERT, RoBERTa,
ELECTRA; :meth:`ModelAdapter.block_roles` of :class:`~heedful.adapters.families._EncoderAdapter`)
are computed here from their roles for the anchor rows alone::

    q = W_q h_a,   K = W_k h,   V = W_v h                         h [B, N, D], h_a [B, 1, D]
    x = LN_1(h_a + W_o softmax(q K^T / sqrt(d) + mask) V)         (Vaswani et al. 2017, Eq. 1)
    o = LN_2(x + W_2 act(W_1 x))

which saves ``(N - 1) / N`` of the last block's query, output and MLP products (on a 6-layer
MiniLM, about a seventh of a forward pass) and gives the anchor's output of the full block up to
float rounding (a test compares them). Only no-gradient passes without hidden states or
attention probabilities, outside any interception and with no hook on the last block, take this
path: everything that reads inside the model sees it exactly as it was built.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn

from heedful.adapters.kernel import scaled_dot_product
from heedful.adapters.roles import BlockRoles


def hooked(module: nn.Module) -> bool:
    """Whether any submodule of ``module`` has a forward hook or pre-hook."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


def anchored_block_output(
    roles: BlockRoles, h: torch.Tensor, mask: torch.Tensor, anchor: torch.Tensor, heads: int
) -> torch.Tensor:
    """The post-LN block's output at ``anchor`` ``[B]`` from its input ``h`` ``[B, N, D]`` and the
    padding ``mask`` ``[B, N]`` (1 = real token): ``[B, D]`` (module docstring)."""
    rows = torch.arange(h.shape[0], device=h.device)
    at = h[rows, anchor][:, None]  # [B, 1, D]

    def split(t: torch.Tensor) -> torch.Tensor:  # [B, M, H*d] -> [B, H, M, d]
        return t.view(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)

    q, k, v = split(roles.query.module(at)), split(roles.key.module(h)), split(roles.value.module(h))
    keep = mask.to(torch.bool)[:, None, None, :]  # [B, 1, 1, N]
    context = scaled_dot_product(q, k, v, attn_mask=keep, scale=1.0 / math.sqrt(q.shape[-1]))
    context = context.transpose(1, 2).reshape(at.shape[0], 1, -1)  # [B, 1, H*d]
    x = roles.attn_norm.module(roles.attn_out.module(context) + at)
    out = roles.mlp_norm.module(roles.mlp_out.module(roles.mlp_act.module(roles.mlp_up.module(x))) + x)
    return out[:, 0]


@contextlib.contextmanager
def anchored_last_block(
    block: nn.Module, roles: BlockRoles, mask: torch.Tensor, anchor: torch.Tensor, heads: int
) -> Iterator[None]:
    """Inside, ``block`` (the last one) returns its input with the ``anchor`` rows ``[B]``
    replaced by the block's output there (:func:`anchored_block_output`); every other position
    of the returned ``[B, N, D]`` is the block's input, which nothing reads."""

    def forward(hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = hidden_states.clone()
        rows = torch.arange(out.shape[0], device=out.device)
        out[rows, anchor] = anchored_block_output(roles, hidden_states, mask, anchor, heads)
        return out

    block.forward = forward
    try:
        yield
    finally:
        del block.forward  # the class's forward again
