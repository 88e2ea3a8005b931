"""Acting on interest: choose the tokens that hold the model's interest and suppress them.

The seed paper's applications (Section 5.4): erase the top-r fraction of a misclassified
example's tokens by interest and re-classify (5.4.1), or weaken chosen prompt words before
generating (5.4.2). These helpers are tensor operations over a whole batch.
"""

from __future__ import annotations

import math

import torch

from heedful.adapters import ModelAdapter
from heedful.engine.batch import Batch
from heedful.engine.perturb import (
    Perturbed,
    never_empty,
    removable_positions,
    removal_id,
    remove_tokens,
)
from heedful.engine.problem import Problem
from heedful.errors import InputError


def top_fraction(scores: torch.Tensor, allowed: torch.Tensor, ratio: float) -> torch.Tensor:
    """``[B, N]`` bool: the ``ceil(ratio * M_b)`` highest-scoring allowed tokens of each example
    (``M_b`` allowed tokens; ties broken by position). ``ratio`` in [0, 1]."""
    if not 0.0 <= ratio <= 1.0:
        raise InputError(f"ratio must be in [0, 1], got {ratio}")
    counts = allowed.sum(dim=1)
    k = torch.ceil(counts.double() * ratio - 1e-9).long()
    ranked = scores.masked_fill(~allowed, float("-inf"))
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1]).expand_as(order))
    return (rank < k[:, None]) & allowed


def suppress(problem: Problem, scores: torch.Tensor, ratio: float, removal: str = "auto") -> tuple[Perturbed, torch.Tensor]:
    """Erase the top-``ratio`` removable tokens of the problem's examples by ``scores`` ``[B, N]``
    (``removal``: ``[MASK]`` for encoders, deletion for causal LMs, ...). Returns the perturbed
    inputs (no row left empty; run them with :class:`heedful.engine.runner.Runner`) and the erased
    positions ``[B, N]``."""
    adapter, batch, target = problem.adapter, problem.batch, problem.target
    erase = top_fraction(scores, removable_positions(batch, target), ratio)
    perturbed = remove_tokens(
        batch.input_ids,
        batch.attention_mask,
        erase,
        target.anchor,
        target.anchor_kind,
        removal_id(adapter, removal),
        adapter.pad_token_id,
        batch.token_type_ids,
    )
    return never_empty(adapter, perturbed), erase


def downweight(adapter: ModelAdapter, batch: Batch, positions: torch.Tensor, weight: float = 0.0) -> torch.Tensor:
    """Word embeddings ``[B, N, E]`` with the tokens at ``positions`` ``[B, N]`` (bool) scaled by
    ``weight`` (0 erases their content, keeping their place); pass them as ``inputs_embeds``."""
    if not math.isfinite(weight):
        raise InputError(f"weight must be a finite number, got {weight}")
    embeds = adapter.embed(batch.input_ids).detach()
    factor = torch.where(positions, torch.tensor(float(weight)), torch.tensor(1.0))
    return embeds * factor[..., None].to(embeds.dtype)
