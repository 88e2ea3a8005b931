"""Word-by-word noise perturbation: the seed paper's Eq. 1 baseline ("individual perturbation").

``rho_j ~ E_z ||phi(x) - phi(x | delta(x_j))||^2``: noise one token at a time with a fixed
``sigma`` and measure the output change. The noise, the noised representation and ``phi`` are
those of co-perturbation (:mod:`heedful.attribution.noise`), so the two are directly
comparable; what differs is that here each token is noised alone, so interactions between
tokens are invisible (the paper's motivation for co-perturbation).
"""

from __future__ import annotations

from typing import Annotated

import torch

from heedful.attribution.noise import (
    SCALE_FACTOR,
    NoiseProbe,
    PhiOutput,
    ScaleBasis,
    Space,
    noise_scale,
    resolve_layer,
)
from heedful.engine.memory import Need
from heedful.engine.options import AT_LEAST_ONE, POSITIVE, RUNTIME
from heedful.engine.problem import Problem
from heedful.engine.runner import Runner
from heedful.engine.seeding import example_generators
from heedful.registry import register


@register(
    "individual_perturbation",
    family="perturbation",
    cost="N x samples forwards (batched)",
    passes=lambda o, n: (1 + n * o["samples"], 0),
    needs_hidden=True,  # the reference pass is the clean pass
    needs=("blocks",),  # the noise lands on the first block's input
)
@torch.no_grad()
def individual_perturbation(
    problem: Problem,
    *,
    sigma: Annotated[float | None, POSITIVE] = None,
    scale_factor: Annotated[float, POSITIVE] = SCALE_FACTOR,
    scale_basis: ScaleBasis = "input",
    samples: Annotated[int, AT_LEAST_ONE] = 8,
    space: Space = "embedding_output",
    output: PhiOutput = "logits",
    layer: int | None = None,
    normalise: bool = True,
    seed: int | None = 0,
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Output change when Gaussian noise of fixed sigma is added to one token at a time.

    Mean distortion when token ``j`` alone is noised, ``[B, N]`` (every real token, specials
    included, as co-perturbation noises them too; 0 on padding).

    ``sigma`` defaults to co-perturbation's noise ceiling, ``scale_factor x`` the std of the
    noised representation (:func:`~heedful.attribution.noise.noise_scale`; ours: the paper fixes
    a sigma without giving it). ``samples`` noise draws per
    token (ours). ``space``, ``output``, ``layer`` and ``normalise`` as in
    :func:`~heedful.attribution.coperturbation.coperturbation`; ``normalise`` divides by the
    mean squared reference output, which leaves each sentence's ranking unchanged.

    Source: Seed paper (co-perturbation interest estimation), Eq. 1: word-by-word perturbation
    """
    adapter, batch = problem.adapter, problem.batch
    key = resolve_layer(adapter, layer)
    probe = NoiseProbe.build(problem, (key,), space, output)
    std = noise_scale(adapter, probe, torch.arange(len(batch), device=batch.input_ids.device), scale_factor, scale_basis, sigma)  # [B]
    real = batch.attention_mask.bool()
    example, position = real.nonzero(as_tuple=True)  # one group of rows per (example, token)
    dim, samples = probe.dim, int(samples)
    # noise per (example, token, sample), drawn from the example's generator in token order
    draws = torch.zeros(example.shape[0], samples, dim, device="cpu")  # drawn from CPU generators
    start = 0
    for g, n in zip(example_generators(batch, seed), batch.lengths.tolist(), strict=True):
        draws[start : start + n] = torch.randn((n, samples, dim), generator=g, device="cpu")
        start += n
    rows_example = example.repeat_interleave(samples)
    rows_position = position.repeat_interleave(samples)
    flat = (draws * std[example, None, None]).reshape(-1, dim)
    out = torch.zeros(rows_example.shape[0], device=adapter.device)
    # rows of similar length run together, each chunk cut to its longest row
    # noised passes run inside an interception (eager attention) and may read hidden states
    need = Need(hidden_states=True, eager=True)
    for idx, width in Runner.for_problem(problem, rows=internal_batch_size).plan(batch.lengths[rows_example], need=need):
        n_rows = idx.shape[0]
        noise = torch.zeros(n_rows, width, dim, device=adapter.device)
        noise[torch.arange(n_rows, device=noise.device), rows_position[idx]] = flat[idx]
        keys = torch.full((n_rows,), key, dtype=torch.long, device=idx.device)
        out[idx] = probe.distortion(rows_example[idx], keys, noise, normalise)
    scores = torch.zeros(batch.input_ids.shape, device=out.device)
    scores[example, position] = out.view(-1, samples).mean(dim=1)
    return scores
