"""Binary keep/remove samples over each example's removable tokens, scored in batched forwards.

The sampling methods (LIME, KernelSHAP, RISE) see an example as ``M_b`` binary features, one per
removable token (content tokens; a fixed anchor such as ``[MASK]`` is never removed). A sample
``z`` in ``{0, 1}^M`` keeps the tokens where ``z = 1`` and removes the others (``[MASK]`` for
encoders, deletion for causal LMs, or any ``removal`` of
:func:`heedful.engine.perturb.removal_id`); an input with every token deleted becomes
the single token ``[BOS]`` (pad/EOS when there is none). Every example draws its samples from its
own generator, so results do not depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from heedful.engine.batch import Batch
from heedful.engine.perturb import Perturbed, removable_positions, remove_from_examples
from heedful.engine.problem import Problem
from heedful.engine.runner import Copies, Runner
from heedful.engine.targets import ResolvedTarget


@dataclass
class Features:
    """``positions`` ``[B, M]``: token position of each feature (``-1`` past ``counts[b]``);
    ``valid`` ``[B, M]``; ``counts`` ``[B]``: number of features ``M_b``."""

    positions: torch.Tensor
    valid: torch.Tensor
    counts: torch.Tensor

    @property
    def width(self) -> int:
        return self.positions.shape[1]


def features_of(batch: Batch, target: ResolvedTarget) -> Features:
    """The removable tokens of every example as interpretable features, in reading order."""
    allowed = removable_positions(batch, target)
    counts = allowed.sum(dim=1)
    width = max(int(counts.max()), 1)
    # stable sort moves removable positions first, keeping their order
    order = torch.sort((~allowed).to(torch.int8), dim=1, stable=True).indices[:, :width]
    valid = torch.arange(width, device=counts.device)[None, :] < counts[:, None]
    positions = torch.where(valid, order, torch.full_like(order, -1))
    return Features(positions, valid, counts)


def to_tokens(features: Features, values: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Per-feature values ``[B, M]`` -> per-token scores ``[B, N]`` (0 elsewhere)."""
    out = torch.zeros(values.shape[0], seq_len + 1, dtype=values.dtype, device=values.device)
    pos = torch.where(features.valid, features.positions, torch.full_like(features.positions, seq_len))
    return out.scatter(1, pos, values)[:, :seq_len]


def perturbed_rows(
    problem: Problem,
    features: Features,
    keep: torch.Tensor,
    example: torch.Tensor,
    removal: str = "auto",
) -> Perturbed:
    """Inputs for rows of examples ``example`` ``[R]`` keeping features ``keep`` ``[R, M]``."""
    batch = problem.batch
    rows, width = keep.shape
    seq = batch.seq_len
    valid = features.valid[example]
    drop = (~keep.bool()) & valid
    # padding features point at an extra column N that is cut off afterwards
    pos = torch.where(valid, features.positions[example], torch.full((rows, width), seq, device=valid.device))
    remove = torch.zeros(rows, seq + 1, dtype=torch.bool, device=pos.device).scatter_(1, pos, drop)[:, :seq]
    return remove_from_examples(problem.adapter, batch, problem.target, example, remove, removal)


@torch.no_grad()
def score_samples(
    problem: Problem,
    features: Features,
    keep: torch.Tensor,
    removal: str = "auto",
    output: str = "probability",
    chunk: int | None = None,
) -> torch.Tensor:
    """The explained output for every sample: ``keep`` ``[B, S, M]`` (bool, per feature) ->
    ``[B, S]``.

    Each distinct perturbed input of an example runs once (samplers repeat coalitions often --
    KernelSHAP's favourite sizes 1 and M-1 have only M members each), and all of them run as
    chunked batches of similar length.
    """
    bsz, samples, width = keep.shape
    keep = keep & features.valid[:, None, :]
    example = torch.arange(bsz, device=keep.device).repeat_interleave(samples)
    rows = torch.cat([example[:, None], keep.reshape(-1, width).long()], dim=1)
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    perturbed = perturbed_rows(problem, features, distinct[:, 1:].bool(), distinct[:, 0], removal)
    values = Runner.for_problem(problem, rows=chunk).scores(Copies.of(perturbed, distinct[:, 0]), output)
    return values[inverse].view(bsz, samples)
