"""heedful.adapters.kernel: half-precision attention through the fused kernel in float32 where a
backward follows on a CPU, and the tensors' own precision otherwise."""

from __future__ import annotations

import pytest
import torch

from heedful.adapters import kernel as kernel_module
from heedful.adapters.kernel import scaled_dot_product


def _attention(q, k, v, causal: bool):
    """Plain softmax(Q K^T / sqrt(d) + causal) V in float64 (Vaswani et al. 2017, Eq. 1), grouped heads repeated."""
    q, k, v = (t.detach().double() for t in (q, k, v))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n, m = scores.shape[-2:]
        allowed = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


def _inputs(dtype, grad: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8)]
    return [torch.randn(s, generator=g).to(dtype).requires_grad_(grad) for s in shapes]


@pytest.fixture
def kernel_dtypes(monkeypatch):
    """The dtypes PyTorch's fused kernel is called with, call by call."""
    seen, kernel = [], kernel_module._fused

    def spy(q, k, v, **options):
        seen.append((q.dtype, k.dtype, v.dtype))
        return kernel(q, k, v, **options)

    monkeypatch.setattr(kernel_module, "_fused", spy)
    return seen


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_with_gradients_run_the_kernel_in_float32(dtype, kernel_dtypes):
    q, k, v = _inputs(dtype, grad=True)
    out = scaled_dot_product(q, k, v, is_causal=False, enable_gqa=True)
    assert kernel_dtypes == [(torch.float32,) * 3]
    assert out.dtype == dtype
    reference = _attention(q, k, v, causal=False)
    # float32 inside: the only half-precision error is the output's one rounding (half an ulp)
    ulp = torch.finfo(dtype).eps
    assert torch.allclose(out.double(), reference, rtol=ulp, atol=ulp * reference.abs().max().item())
    out.float().square().sum().backward()
    assert q.grad.dtype == dtype and k.grad.dtype == dtype and v.grad.dtype == dtype


def test_float32_gradients_match_a_float64_loop():
    q, k, v = _inputs(torch.float32, grad=True, seed=1)
    from torch.nn.attention.bias import causal_lower_right

    out = scaled_dot_product(q, k, v, attn_mask=causal_lower_right(3, 5), enable_gqa=True)
    assert torch.allclose(out.double(), _attention(q, k, v, causal=True), atol=1e-5)


def test_without_gradients_half_inputs_keep_their_own_kernel(kernel_dtypes):
    q, k, v = _inputs(torch.bfloat16, grad=False, seed=2)
    native = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.equal(scaled_dot_product(q, k, v, enable_gqa=True), native)
    q, k, v = _inputs(torch.bfloat16, grad=True, seed=2)
    with torch.no_grad():
        assert torch.equal(scaled_dot_product(q, k, v, enable_gqa=True), native)
    assert kernel_dtypes == [(torch.bfloat16,) * 3] * 2


def test_an_additive_half_mask_is_widened_with_the_inputs():
    q, k, v = _inputs(torch.bfloat16, grad=True, seed=3)
    mask = torch.zeros(3, 5, dtype=torch.bfloat16)
    mask[:, 0] = float("-inf")
    out = scaled_dot_product(q, k, v, attn_mask=mask, enable_gqa=True)
    kept = _attention(q[..., :, :], k[:, :, 1:], v[:, :, 1:], causal=False)
    ulp = torch.finfo(torch.bfloat16).eps
    assert torch.allclose(out.double(), kept, rtol=ulp, atol=ulp * kept.abs().max().item())


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_half_precision_model_s_gradient_passes_reach_the_kernel_in_float32(family, monkeypatch):
    """Encoders and padded decoders run transformers' "sdpa" attention under heedful's name
    (kernel.FUSED_ATTENTION): a model stored in bfloat16 explained by gradients gets the kernel
    in float32, its forward-only passes in bfloat16; the scores agree with the float32 model's
    within bfloat16's bound (tests/test_half_precision.py)."""
    import numpy as np

    import heedful
    from heedful.testing import tiny_hf

    full, tokenizer = tiny_hf(family, "classification", initializer_range=0.2)
    half, _ = tiny_hf(family, "classification", initializer_range=0.2)
    texts = ["a charming and often affecting journey", "dull"]  # padded: the model builds its mask
    expected = heedful.from_pretrained_objects(full, tokenizer).explain(texts, "saliency", target=0)
    lm = heedful.from_pretrained_objects(half.to(torch.bfloat16), tokenizer)
    seen, kernel = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **options):
        seen.append((q.dtype, torch.is_grad_enabled() and q.requires_grad))
        return kernel(q, k, v, **options)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)  # transformers' "sdpa"
    monkeypatch.setattr(kernel_module, "_fused", spy)  # heedful's causal path
    found = lm.explain(texts, "saliency", target=0)  # a fixed class: a near-tie may flip the predicted one in bf16
    graded = {dtype for dtype, grad in seen if grad}
    assert graded == {torch.float32}
    seen.clear()
    lm.predict(texts)
    assert seen and {dtype for dtype, _ in seen} == {torch.bfloat16}
    for e, f in zip(expected, found, strict=True):
        assert np.abs(f.scores - e.scores).max() <= 0.15 * np.abs(e.scores).max()
