"""Causal attention aligned to the last key, for decoder passes whose only mask is causality.

A pass that continues a key/value cache (prefix reuse, chunked prefill) computes its ``q``
queries as the last ``q`` of ``k`` positions. ``transformers``' ``"sdpa"`` implementation
builds that causal pattern as a boolean ``[B, 1, q, k]`` mask, and with a mask it repeats the
key/value heads of grouped-query models; the fused kernel then scores every query against every
key and converts the mask for each row. Registered with ``AttentionInterface`` as
:data:`CAUSAL_ATTENTION` -- and with no mask function, so ``transformers`` builds no mask --
:func:`causal_attention` gives PyTorch's kernel the pattern itself
(``torch.nn.attention.bias.causal_lower_right``; ``is_causal`` when ``q == k``) and the
grouped key/value heads as they are (``enable_gqa``): the same outputs beyond float rounding,
with blocks above the diagonal skipped and no ``[q, k]`` mask per row.

Valid only where no other mask is needed: decoders, no padding before a real position (right
padding is never read by a real query). :meth:`heedful.adapters.ModelAdapter.forward` selects it
exactly there.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from heedful.adapters.kernel import scaled_dot_product

CAUSAL_ATTENTION = "heedful_causal"
"""The name :func:`causal_attention` is registered under with ``AttentionInterface``."""


def causal_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` ``[B, H, q, d]`` over ``key`` / ``value`` ``[B, Hkv, k, d]``
    (``q <= k``; ``H`` a multiple of ``Hkv``) where query ``i`` sits at position ``k - q + i``
    and sees keys ``0 .. k - q + i``: ``softmax(Q K^T * scaling + causal) V`` (Vaswani et al.
    2017, Eq. 1) -> ``[B, q, H, d]`` and no attention probabilities. ``attention_mask`` is
    ``None`` (no mask function is registered for this implementation)."""
    if attention_mask is not None:
        raise ValueError(f"{CAUSAL_ATTENTION!r} attention takes no mask; it is selected only for causal passes")
    q, k = query.shape[2], key.shape[2]
    # imported here: torch.nn.attention.bias loads torch._dynamo (~1.3 s of start-up)
    from torch.nn.attention.bias import causal_lower_right

    out = scaled_dot_product(
        query,
        key,
        value,
        attn_mask=causal_lower_right(q, k) if q != k else None,
        is_causal=q == k and q > 1,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(CAUSAL_ATTENTION, causal_attention)
