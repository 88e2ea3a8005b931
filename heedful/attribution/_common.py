"""Small helpers shared by attribution methods."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import torch

from heedful.adapters import ModelAdapter
from heedful.batch import Batch
from heedful.perturb import Perturbed
from heedful.targets import ResolvedTarget

TOKEN_BUDGET = 16384
"""Default number of (sequence x position) cells per forward chunk in expanded batches."""


def chunk_rows(rows: int, width: int, chunk_rows: int | None = None) -> Iterator[slice]:
    """Slices over ``rows`` rows, each small enough that ``rows_in_chunk * width <= TOKEN_BUDGET``."""
    size = chunk_rows or max(1, TOKEN_BUDGET // max(width, 1))
    for start in range(0, rows, size):
        yield slice(start, min(rows, start + size))


def output_of(target: ResolvedTarget, logits: torch.Tensor, output: str) -> torch.Tensor:
    """The explained scalar per row: the target logit (default) or its softmax probability."""
    if output == "logit":
        return target.score(logits)
    if output == "probability":
        if target.task == "regression":
            return target.score(logits)
        return target.score(torch.softmax(logits.float(), dim=-1))
    raise ValueError(f"output must be 'logit' or 'probability', got {output!r}")


@torch.no_grad()
def score_perturbed(
    adapter: ModelAdapter,
    batch: Batch,
    target: ResolvedTarget,
    perturbed: Perturbed,
    row_example: torch.Tensor,
    output: str = "logit",
    chunk: int | None = None,
) -> torch.Tensor:
    """Explained scalar for each perturbed row ``[R]``; ``row_example[r]`` is the row's example."""
    scores = []
    for sl in chunk_rows(perturbed.input_ids.shape[0], perturbed.input_ids.shape[1], chunk):
        rows_target = target.select(row_example[sl]).with_anchor(perturbed.anchor[sl])
        types = None if perturbed.token_type_ids is None else perturbed.token_type_ids[sl]
        fwd = adapter.forward(
            batch,
            rows_target.anchor,
            input_ids=perturbed.input_ids[sl],
            attention_mask=perturbed.attention_mask[sl],
            token_type_ids=types,
        )
        scores.append(output_of(rows_target, fwd.logits, output))
    return torch.cat(scores)


def seeded_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(0 if seed is None else int(seed))
    return gen


def example_generators(batch: Batch, seed: int | None) -> list[torch.Generator]:
    """One generator per example, seeded from ``seed`` and the example's text, so stochastic
    methods give the same scores for a text whatever batch it is in."""
    base = (0 if seed is None else int(seed)) * 1_000_003
    return [
        seeded_generator(base + zlib.crc32(f"{text}\x00{pair or ''}".encode()))
        for text, pair in zip(batch.texts, batch.text_pairs, strict=True)
    ]
