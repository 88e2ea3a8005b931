"""PyTorch's fused attention kernel, run at the precision that is fast where gradients follow.

On CPUs the half-precision ``scaled_dot_product_attention`` kernels are slower than float32's,
and their backward far slower: measured on an AMD EPYC with AVX-512 BF16 (PyTorch 2.13, one
thread; 16 sequences x 9 heads (3 key/value heads) x 64 dimensions, 8 queries over 30 keys),
bfloat16 forward + backward 25.6 ms against 3.0 ms in float32, and 3.3 ms when the bfloat16
inputs are widened to float32 for the kernel and its output narrowed back. In a bfloat16
generation attribution of ``smollm2-135m`` that backward took 2.3 s of 6.6 s, against 0.17 s
at float32, eating the matrix products' gain (2.4 s against 4.5 s). Forward-only, the kernels
are within about 20 % of each other in either direction, so a pass without gradients keeps the
tensors' own precision.

The fused passes of models that build their own mask (encoders, padded decoders) run
``transformers``' ``"sdpa"`` attention; :data:`FUSED_ATTENTION` registers it, with the same
widening, under a name of its own (``AttentionInterface`` and ``AttentionMaskInterface``), which
:meth:`heedful.adapters.ModelAdapter.forward` selects for them.

>>> import torch
>>> q = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16, requires_grad=True)
>>> scaled_dot_product(q, q, q, is_causal=True).dtype
torch.bfloat16
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention as _fused
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

_HALF = (torch.bfloat16, torch.float16)

FUSED_ATTENTION = "heedful_sdpa"
"""The name :func:`fused_attention` is registered under (with ``"sdpa"``'s mask function)."""


def _widened(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the kernel runs in float32 for these inputs (module docstring)."""
    return (
        query.device.type == "cpu"
        and query.dtype in _HALF
        and torch.is_grad_enabled()
        and (query.requires_grad or key.requires_grad or value.requires_grad)
    )


def _float_mask(mask):
    """An additive half-precision mask in float32; a boolean mask or a ``CausalBias`` pattern as it is."""
    return mask.float() if type(mask) is torch.Tensor and mask.is_floating_point() else mask


def scaled_dot_product(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options) -> torch.Tensor:
    """``softmax(Q K^T * scale + mask) V`` (Vaswani et al. 2017, Eq. 1) by
    :func:`torch.nn.functional.scaled_dot_product_attention` with its ``options``: ``query``
    ``[B, H, q, d]``, ``key`` / ``value`` ``[B, Hkv, k, d]`` -> ``[B, H, q, d]`` in ``query``'s
    dtype. Half-precision inputs on a CPU whose backward will run (autograd on and an input
    requiring gradients) go through the kernel in float32 (module docstring)."""
    if not _widened(query, key, value):
        return _fused(query, key, value, **options)
    if "attn_mask" in options:
        options = {**options, "attn_mask": _float_mask(options["attn_mask"])}
    return _fused(query.float(), key.float(), value.float(), **options).to(query.dtype)


def fused_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``transformers``' ``"sdpa"`` attention (``query`` ``[B, H, q, d]``, ``key`` / ``value``
    ``[B, Hkv, k, d]`` -> ``[B, q, H, d]``), its kernel in float32 where :func:`scaled_dot_product`
    would widen it."""
    if not _widened(query, key, value):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), _float_mask(attention_mask), **kwargs)
    return out.to(query.dtype), weights


AttentionInterface.register(FUSED_ATTENTION, fused_attention)
AttentionMaskInterface.register(FUSED_ATTENTION, sdpa_mask)
