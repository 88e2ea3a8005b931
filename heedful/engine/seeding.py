"""Seeded random generators: one per example, so a stochastic method gives the same scores for
a text whatever batch it is in."""

from __future__ import annotations

import zlib

import torch

from heedful.engine.batch import Batch


def seeded_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (``None`` counts as 0)."""
    gen = torch.Generator()
    gen.manual_seed(0 if seed is None else int(seed))
    return gen


def example_generators(batch: Batch, seed: int | None) -> list[torch.Generator]:
    """One generator per example of ``batch``, seeded from ``seed`` and the example's text (and
    pair), so stochastic methods give the same scores for a text whatever batch it is in."""
    base = (0 if seed is None else int(seed)) * 1_000_003
    return [
        seeded_generator(base + zlib.crc32(f"{text}\x00{pair or ''}".encode()))
        for text, pair in zip(batch.texts, batch.text_pairs, strict=True)
    ]
