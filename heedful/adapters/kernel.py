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

>>> import torch
>>> q = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16, requires_grad=True)
>>> scaled_dot_product(q, q, q, is_causal=True).dtype
torch.bfloat16
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention as _fused

_HALF = (torch.bfloat16, torch.float16)


def scaled_dot_product(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options) -> torch.Tensor:
    """``softmax(Q K^T * scale + mask) V`` (Vaswani et al. 2017, Eq. 1) by
    :func:`torch.nn.functional.scaled_dot_product_attention` with its ``options``: ``query``
    ``[B, H, q, d]``, ``key`` / ``value`` ``[B, Hkv, k, d]`` -> ``[B, H, q, d]`` in ``query``'s
    dtype. Half-precision inputs on a CPU whose backward will run (autograd on and an input
    requiring gradients) go through the kernel in float32 (module docstring)."""
    dtype = query.dtype
    widen = (
        query.device.type == "cpu"
        and dtype in _HALF
        and torch.is_grad_enabled()
        and (query.requires_grad or key.requires_grad or value.requires_grad)
    )
    if not widen:
        return _fused(query, key, value, **options)
    mask = options.get("attn_mask")
    if type(mask) is torch.Tensor and mask.is_floating_point():  # an additive mask; a CausalBias is a pattern
        options = {**options, "attn_mask": mask.float()}
    out = _fused(query.float(), key.float(), value.float(), **options)
    return out.to(dtype)
