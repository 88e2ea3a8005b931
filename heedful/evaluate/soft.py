"""Soft comprehensiveness and soft sufficiency (Zhao & Aletras 2023): instead of removing the
top-ranked tokens whole, every token's word embedding loses dimensions in proportion to its
importance, so that every score counts, not only the ranking above a cut.

The raw measurement (source ``"soft"``) is the explained output on two copies of each example:
``x_C``, where each embedding dimension of token ``i`` is kept with probability ``1 - s_i``
(important tokens erased), and ``x_S``, kept with probability ``s_i`` (only important tokens
left); ``s`` are the scores min-max normalised to ``[0, 1]`` over the protocol's rankable tokens
(its ``specials``; a masked LM's anchor never), the others never perturbed. Both copies share one uniform draw
``U`` ``[N, E]`` per example (``keep = U < p``), seeded per example, so a metric's value does
not depend on the batch an example is measured in.
"""

from __future__ import annotations

import numpy as np
import torch

from heedful.engine.problem import reference_pass
from heedful.evaluate.perturbation import Outputs, Prepared, output_tensors

SOFT_SEED = 0
"""The seed of every example's Bernoulli draw (Zhao & Aletras draw one mask per example)."""


def normalised_scores(scores: torch.Tensor, rankable: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` scores min-max normalised to ``[0, 1]`` over each example's rankable positions;
    0 elsewhere, and 0 everywhere for an example whose scores are all equal."""
    low = torch.where(rankable, scores, torch.full_like(scores, torch.inf)).amin(dim=1, keepdim=True)
    high = torch.where(rankable, scores, torch.full_like(scores, -torch.inf)).amax(dim=1, keepdim=True)
    span = (high - low).clamp(min=torch.finfo(scores.dtype).tiny)
    return torch.where(rankable, (scores - low) / span, torch.zeros_like(scores)).clamp(0, 1)


def soft_masks(importance: torch.Tensor, rankable: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bernoulli keep-masks ``[B, N, E]`` of the word-embedding dimensions: ``(comprehensiveness,
    sufficiency)``, kept with probability ``1 - importance`` and ``importance`` at the rankable
    positions, always kept elsewhere. One uniform draw per example, seeded with :data:`SOFT_SEED`."""
    bsz, width = importance.shape
    draws = torch.stack(
        [torch.rand(width, dim, generator=torch.Generator().manual_seed(SOFT_SEED), dtype=torch.float64) for _ in range(bsz)]
    ).to(importance.device)
    p = importance[:, :, None].double()
    fixed = ~rankable[:, :, None]
    return fixed | (draws < 1 - p), fixed | (draws < p)


@torch.no_grad()
def measure_soft(prepared: Prepared) -> tuple[Outputs, Outputs]:
    """The explained outputs ``[B]`` of the soft-erased copies ``(x_C, x_S)`` (module docstring):
    two forwards per example, batched."""
    adapter, batch, anchor = prepared.adapter, prepared.batch, prepared.problem.anchor
    embeds = adapter.embed(batch.input_ids)  # [B, N, E]
    importance = normalised_scores(prepared.scores.to(embeds.device), prepared.rankable.to(embeds.device))
    erase, keep = soft_masks(importance, prepared.rankable.to(embeds.device), embeds.shape[2])
    found = []
    for mask in (erase, keep):
        logits = reference_pass(adapter, batch, anchor, embeds * mask.to(embeds.dtype)).logits
        found.append(Outputs.of(output_tensors(prepared.target, logits, prepared.protocol.output)))
    return found[0], found[1]


SOFT_FIELDS = ("soft_erased", "soft_kept")
"""The record keys' prefixes of the two copies (``x_C``, ``x_S``)."""


def soft_records(erased: Outputs, kept: Outputs) -> list[dict]:
    """Per example, the ``"soft"`` measurement as JSON-ready fields (the results store)."""
    return [
        {f"{name}_{f}": getattr(outs, f)[b].item() for name, outs in zip(SOFT_FIELDS, (erased, kept), strict=True) for f in Outputs.FIELDS}
        for b in range(len(erased.output))
    ]


def soft_from_records(rows: list[dict]) -> tuple[Outputs, Outputs]:
    """:func:`soft_records` read back: ``(erased, kept)`` :class:`Outputs` ``[B]``."""
    return tuple(  # type: ignore[return-value]
        Outputs(*(np.array([r[f"{name}_{f}"] for r in rows], dtype=np.int64 if f == "predicted" else float) for f in Outputs.FIELDS))
        for name in SOFT_FIELDS
    )
