"""The random baseline every faithfulness comparison needs."""

from __future__ import annotations

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.attribution._common import example_generators
from heedful.batch import Batch
from heedful.registry import register
from heedful.targets import ResolvedTarget


@register(
    "random",
    family="baseline",
    cost="no pass of its own (explain still runs the 1 forward that gives the prediction)",
    citation="Random baseline (e.g. DeYoung et al. 2020, ERASER)",
    summary="Uniform random scores in [0, 1); the floor any method must beat.",
    stochastic=True,
)
def random_scores(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    reference: Forward | None = None,
    seed: int | None = 0,
) -> torch.Tensor:
    """Scores ``[B, N]`` drawn uniformly from [0, 1).

    Each example's generator is seeded from ``seed`` and the example's text, so the same seed
    gives the same scores whatever the batch composition.
    """
    scores = torch.zeros(batch.input_ids.shape)
    for b, (gen, n) in enumerate(zip(example_generators(batch, seed), batch.lengths.tolist(), strict=True)):
        scores[b, :n] = torch.rand(n, generator=gen)
    return scores
