"""The prefix-keyed normal draws (:mod:`heedful.engine.prefix_noise`) against a plain-Python
SplitMix64 and Box-Muller from the module's equations, and the properties SmoothGrad's shared
generation path rests on: a prefix draws what its row draws, one sample alone what it draws
among others, whatever the threads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from heedful.engine.prefix_noise import prefix_keys, prefix_normal

MASK64 = (1 << 64) - 1
SAME = {"rtol": 1e-6, "atol": 1e-6}
"""One draw computed twice: its integer key and counter are exact, but float32 ``log`` and ``cos``
may round differently (an ulp, about 1e-7 relative) in a vectorised kernel and in its scalar
tail, which tensors of other shapes or other thread splits put a draw in."""
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's finalizer on Python integers (Steele, Lea & Flood 2014)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def oracle(ids: list[int], seed: int, samples: int, dim: int) -> np.ndarray:
    """``[samples, len(ids), dim]`` draws as a loop: prefix keys, counters, Box-Muller."""
    salt = mix64((seed * GOLDEN) & MASK64)
    out = np.zeros((samples, len(ids), dim))
    total = 0
    for j, token in enumerate(ids):
        total = (total + mix64((token + (j + 1) * GOLDEN) & MASK64)) & MASK64
        key = mix64((total + salt) & MASK64)
        for k in range(samples):
            for d in range(dim):
                x = mix64((key + (k * dim + d + 1) * GOLDEN) & MASK64)
                u1 = ((x >> 40) + 1) / 2**24
                u2 = ((x >> 16) & 0xFFFFFF) / 2**24
                out[k, j, d] = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
    return out


def test_draws_equal_a_plain_python_generator():
    ids = torch.tensor([[3, 17, 250_000, 9], [3, 17, 4, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    z = prefix_normal(ids, mask, seed=11, samples=2, dim=5)
    for b, n in enumerate(mask.sum(1).tolist()):
        expected = oracle(ids[b, :n].tolist(), 11, 2, 5)
        np.testing.assert_allclose(z[b, :, :n].numpy(), expected, atol=2e-6, rtol=1e-5)  # float32 log and cos
        assert not z[b, :, n:].any()


def test_a_prefix_draws_what_its_row_draws_and_nothing_else_does():
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 1, 2], [5, 4, 7, 8, 9]])
    z = prefix_normal(ids, torch.ones_like(ids), seed=0, samples=3, dim=16)
    torch.testing.assert_close(z[0, :, :3], z[1, :, :3], **SAME)  # the shared prefix 5 6 7
    assert not torch.equal(z[0, :, 3], z[1, :, 3])
    torch.testing.assert_close(z[0, :, 0], z[2, :, 0], **SAME)
    # a token changed at position 1 changes every later position's draw, though positions 2-4 agree
    assert all(not torch.equal(z[0, :, j], z[2, :, j]) for j in range(1, 5))
    short = prefix_normal(ids[:, :2], torch.ones(3, 2, dtype=torch.long), seed=0, samples=3, dim=16)
    torch.testing.assert_close(short, z[:, :, :2], **SAME)
    assert prefix_keys(ids, 0)[0, 2] == prefix_keys(ids, 0)[1, 2] != prefix_keys(ids, 1)[0, 2]


def test_one_sample_alone_draws_what_it_draws_among_others_whatever_the_threads():
    ids = torch.randint(0, 1000, (4, 30), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = prefix_normal(ids, mask, seed=2, samples=6, dim=300)
        torch.set_num_threads(2)
        two = prefix_normal(ids, mask, seed=2, samples=6, dim=300)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(one, two, **SAME)
    torch.testing.assert_close(prefix_normal(ids, mask, 2, range(4, 5), 300)[:, 0], one[:, 4], **SAME)


def test_draws_follow_the_standard_normal_law_without_correlation():
    ids = torch.randint(0, 50_000, (40, 50), generator=torch.Generator().manual_seed(1))
    z = prefix_normal(ids, torch.ones_like(ids), seed=0, samples=4, dim=256).double()  # 2.0 M draws
    flat = z.flatten()
    se = 1 / math.sqrt(flat.numel())
    assert abs(float(flat.mean())) < 5 * se
    assert abs(float(flat.std()) - 1) < 5 / math.sqrt(2 * flat.numel())  # the standard error of a normal std
    assert abs(float(((flat - flat.mean()) ** 4).mean() / flat.var() ** 2) - 3) < 0.02  # normal kurtosis
    for k in (0.5, 1.0, 2.0, 3.0):  # tail shares of the normal law
        share = float((flat.abs() > k).double().mean())
        assert share == pytest.approx(math.erfc(k / math.sqrt(2)), abs=5 * math.sqrt(share / flat.numel()) + 1e-6)

    def corr(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])

    bound = 5 / math.sqrt(z[:, :, :, 1:].numel())
    assert abs(corr(z[..., 1:], z[..., :-1])) < bound  # neighbouring dimensions
    assert abs(corr(z[:, :, 1:], z[:, :, :-1])) < bound  # neighbouring positions
    assert abs(corr(z[:, 1:], z[:, :-1])) < bound  # samples
    assert abs(corr(z[1:], z[:-1])) < bound  # rows
