"""The random baseline every faithfulness comparison needs."""

from __future__ import annotations

import torch

from heedful.engine.problem import Problem
from heedful.engine.seeding import example_generators
from heedful.registry import register


@register(
    "random",
    family="baseline",
    cost="no pass of its own (explain still runs the 1 forward that gives the prediction)",
)
def random_scores(problem: Problem, *, seed: int | None = 0) -> torch.Tensor:
    """Uniform random scores in [0, 1); the floor any method must beat.

    Scores ``[B, N]`` drawn uniformly from [0, 1).

    Each example's generator is seeded from ``seed`` and the example's text, so the same seed
    gives the same scores whatever the batch composition.

    Source: Random baseline (e.g. DeYoung et al. 2020, ERASER)
    """
    batch = problem.batch
    scores = torch.zeros(batch.input_ids.shape, device="cpu")  # drawn from CPU generators
    for b, (gen, n) in enumerate(zip(example_generators(batch, seed), batch.lengths.tolist(), strict=True)):
        scores[b, :n] = torch.rand(n, generator=gen, device="cpu")
    return scores
