"""The arithmetic counter of ``benchmarks/generation_work.py`` (``generation.Work``): matrix
products counted below ``vmap``, the CPU's fused attention kernel counted as the eager products
it fuses, and the script's bad input refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from generation import Work  # noqa: E402
from generation_work import main  # noqa: E402


def test_a_backward_vmapped_over_n_cotangents_counts_n_products():
    x = torch.randn(6, 10, requires_grad=True)
    w = torch.randn(10, 7)
    y = x @ w
    for n in (1, 4):
        cotangents = torch.randn(n, *y.shape)
        with Work() as work:
            if n == 1:
                torch.autograd.grad(y, x, cotangents[0], retain_graph=True)
            else:
                torch.autograd.grad(y, x, cotangents, is_grads_batched=True, retain_graph=True)
        assert work.counts == {"mm": n * 2 * 6 * 7 * 10}  # dx = dy w^T: [6, 7] x [7, 10] per cotangent


def test_the_fused_attention_kernel_counts_what_eager_attention_multiplies():
    torch.manual_seed(0)
    b, h, q, k, d = 2, 3, 4, 9, 8
    query = torch.randn(b, h, q, d, requires_grad=True)
    key, value = torch.randn(b, h, k, d, requires_grad=True), torch.randn(b, h, k, d, requires_grad=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), Work() as fused:  # the CPU's fused kernel, whatever the default
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value)
    with Work() as eager:
        reference = torch.softmax(query @ key.transpose(-1, -2) / d**0.5, dim=-1) @ value
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    assert sum(fused.counts.values()) == sum(eager.counts.values()) == 2 * 2 * b * h * q * k * d
    with Work() as backward:
        torch.autograd.grad(out, (query, key, value), torch.randn_like(out))
    assert sum(backward.counts.values()) == 5 * 2 * b * h * q * k * d


@pytest.mark.parametrize("argv,named", [(["--ig-points", "3", "3"], "--ig-points"), (["--ig-steps", "0"], "--ig-steps")])
def test_path_counts_are_refused_in_one_line_before_anything_loads(capsys, argv, named):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "try" in err[0]


def test_a_causal_pattern_is_made_inside_the_counter_and_restored_after():
    import torch.nn.attention.bias as bias

    before = bias.causal_lower_right
    with Work():
        mask = bias.causal_lower_right(2, 4)
    assert bias.causal_lower_right is before
    assert torch.equal(mask, torch.tensor([[True, True, True, False], [True, True, True, True]]))
