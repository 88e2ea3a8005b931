"""Standard normal draws keyed by token prefixes: the draw for position ``j`` depends only on
the seed and the tokens at positions ``0 .. j``.

A stochastic method that noises each position (SmoothGrad) then gives a text's prefix the same
noise on its positions as the whole text: the steps of a generation, each explained on its own
prefix, see the noise the whole sequence sees, so one noised forward over the sequence serves
every step (:mod:`heedful.generation_shared`). A text's draws are the same whatever batch it is
in, and on any device.

The generator is counter-based (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2,
3"): each draw is a pure function of its key and counter, computed with tensor operations over
whole blocks -- no sequential state. Mixing is SplitMix64's finalizer (Steele, Lea & Flood
2014, "Fast splittable pseudorandom number generators"); a 64-bit mix gives two 24-bit
uniforms, and Box-Muller (Box & Muller 1958) one standard normal from them.

- prefix key ``h_j = mix(s + sum_{i <= j} mix(id_i + (i + 1) G))`` with ``s = mix(seed G)``
  (``G`` SplitMix64's increment; sums wrap modulo ``2^64``);
- the draw for sample ``k`` and dimension ``d`` at position ``j``: ``x = mix(h_j + (k E + d + 1) G)``,
  ``u_1 = (x[40:64] + 1) / 2^24``, ``u_2 = x[16:40] / 2^24``,
  ``z = sqrt(-2 ln u_1) cos(2 pi u_2)``.
"""

from __future__ import annotations

import math

import torch


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 it is stored as."""
    return value - (1 << 64) if value >= 1 << 63 else value


GOLDEN = _signed(0x9E3779B97F4A7C15)
"""SplitMix64's increment (the odd integer nearest ``2^64 / phi``)."""
_MULTIPLIERS = ((30, _signed(0xBF58476D1CE4E5B9)), (27, _signed(0x94D049BB133111EB)), (31, None))
BLOCK = 1 << 17
"""Draws computed per block: their int64 temporaries stay in the processor's cache."""


def _shift_xor(z: torch.Tensor, shift: int, scratch: torch.Tensor) -> None:
    """``z ^= z >>> shift`` in place (a logical shift: int64's ``>>`` keeps the sign)."""
    torch.bitwise_right_shift(z, shift, out=scratch)
    scratch.bitwise_and_((1 << (64 - shift)) - 1)
    z.bitwise_xor_(scratch)


def mix(z: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """SplitMix64's finalizer of int64 ``z``, in place (products wrap modulo ``2^64``); a
    bijection of 64-bit values. ``scratch``: a tensor of ``z``'s shape it may overwrite."""
    scratch = torch.empty_like(z) if scratch is None else scratch
    for shift, multiplier in _MULTIPLIERS:
        _shift_xor(z, shift, scratch)
        if multiplier is not None:
            z.mul_(multiplier)
    return z


def prefix_keys(input_ids: torch.Tensor, seed: int | None) -> torch.Tensor:
    """``h`` ``[B, N]`` int64: the key of each position's prefix (module docstring), the same
    for position ``j`` of any two rows whose first ``j + 1`` ids agree. ``seed`` ``None``
    counts as 0."""
    ids = input_ids.to(torch.int64)
    positions = torch.arange(1, ids.shape[-1] + 1, device=ids.device, dtype=torch.int64)
    tokens = mix(ids + positions * GOLDEN)
    salt = mix(torch.tensor([(0 if seed is None else int(seed))], dtype=torch.int64, device=ids.device) * GOLDEN)
    return mix(tokens.cumsum(dim=-1) + salt)


def draws(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Standard normal float32 draws ``[M, C]`` for keys ``[M]`` and int64 counters ``[C]``
    (module docstring), in blocks of about :data:`BLOCK` draws."""
    out = torch.empty(len(keys), len(counters), dtype=torch.float32, device=keys.device)
    steps = (counters + 1) * GOLDEN
    rows = max(1, BLOCK // max(1, len(counters)))
    for start in range(0, len(keys), rows):
        x = keys[start : start + rows, None] + steps[None, :]
        scratch = torch.empty_like(x)
        mix(x, scratch)
        torch.bitwise_right_shift(x, 40, out=scratch)
        u1 = scratch.bitwise_and_((1 << 24) - 1).to(torch.float32).add_(1.0).mul_(2.0**-24)  # (0, 1]
        angle = x.bitwise_right_shift_(16).bitwise_and_((1 << 24) - 1).to(torch.float32).mul_(2 * math.pi * 2.0**-24)
        block = out[start : start + rows]
        torch.log(u1, out=block)
        block.mul_(-2.0).sqrt_().mul_(angle.cos_())
    return out


def prefix_normal(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int | None, samples: int | range, dim: int
) -> torch.Tensor:
    """``z`` ``[B, K, N, dim]`` float32 standard normal draws of samples ``k`` in ``samples``
    (``range(samples)`` for a count; ``K`` of them), 0 where ``attention_mask`` ``[B, N]`` is 0;
    ``z[b, k, j]`` depends only on ``seed``, ``k`` and ``input_ids[b, :j + 1]``, so a prefix of
    a row draws what the row draws on its positions, and one sample drawn alone what it draws
    among others.

    >>> ids = torch.tensor([[5, 7, 9], [5, 7, 0]])
    >>> z = prefix_normal(ids, torch.tensor([[1, 1, 1], [1, 1, 0]]), seed=0, samples=2, dim=4)
    >>> same = torch.allclose(z[0, :, :2], z[1, :, :2], rtol=0, atol=1e-6)  # an ulp: log and cos, vectorised or not
    >>> z.shape, same, bool(z[1, :, 2].eq(0).all())
    (torch.Size([2, 2, 3, 4]), True, True)
    """
    bsz, seq = input_ids.shape
    samples = range(samples) if isinstance(samples, int) else samples
    real = attention_mask.to(input_ids.device).bool()
    keys = prefix_keys(input_ids, seed)[real]  # [M] the real positions, row by row
    counters = torch.arange(samples.start * dim, samples.stop * dim, device=input_ids.device, dtype=torch.int64)
    values = draws(keys, counters)
    out = torch.zeros(bsz, seq, len(samples), dim, dtype=torch.float32, device=input_ids.device)
    out[real] = values.view(-1, len(samples), dim)
    return out.permute(0, 2, 1, 3)
