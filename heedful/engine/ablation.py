"""The ablation core of the perturbation methods: remove sets of tokens, measure the output's drop,
give each token the mean drop of the removals it was part of.

A removal method describes its perturbations as a boolean ``remove`` ``[B, K, N]`` -- up to
``K`` sets of positions to remove from each example -- and :func:`removal_drops` runs them
batched and returns ``f(x_b) - f(x_b without remove[b, k])`` ``[B, K]``. :func:`token_means`
turns the drops into token scores as Captum's ``Occlusion`` does (a feature ablation whose
features are sliding windows, each token's attribution the mean over the windows that cover it);
:func:`sliding_windows` builds those windows over the removable tokens of every example. Window
1 and stride 1 remove each token alone: leave-one-out (Li et al. 2016, Eq. 2) is this core's
simplest case, and :func:`heedful.attribution.perturbation.leave_one_out` computes it so.

A method on this core, with its oracle and checks, is the worked example of ``docs/extending.md``
("A method that removes tokens").
"""

from __future__ import annotations

import torch

from heedful.engine.perturb import removable_positions
from heedful.engine.precision import forward_precision
from heedful.engine.problem import Problem, reference_pass
from heedful.engine.reuse import removal_scores
from heedful.errors import InputError


@torch.no_grad()
def reference_logits(problem: Problem, precision: str) -> torch.Tensor:
    """The unperturbed logits at the anchors ``[B, C]`` at ``precision``: the problem's own
    reference pass at ``"fp32"``, else one more pass of the unperturbed inputs (to be called
    inside :func:`~heedful.engine.precision.forward_precision`), so that a method's output differences
    compare passes of one precision."""
    if precision == "fp32":
        return problem.reference.logits.detach()
    return reference_pass(problem.adapter, problem.batch, problem.anchor, problem.inputs_embeds).logits


@torch.no_grad()
def removal_drops(
    problem: Problem,
    remove: torch.Tensor,
    *,
    output: str = "logit",
    removal: str = "auto",
    precision: str = "fp32",
    reuse: bool = False,
    rows: int | None = None,
) -> torch.Tensor:
    """The drop of the explained output when the positions ``remove`` ``[B, K, N]`` (bool) are
    removed from each example: ``f(x_b) - f(x_b without remove[b, k])`` -> ``[B, K]``.

    ``output``: the target's ``"logit"``, ``"probability"``, ``"log_prob"`` or ``"logit_prob"``
    as ``f`` (:meth:`~heedful.engine.targets.ResolvedTarget.output`); ``removal``: how a token is removed
    (:func:`heedful.engine.perturb.removal_id`: ``"auto"`` is ``[MASK]`` for encoders and deletion for
    causal LMs); ``precision``: the passes' precision (``"fp32"``, ``"bf16"``, ``"int8"``;
    :mod:`heedful.engine.precision`), ``f(x_b)`` included; ``reuse``: decoder copies continue their
    example's key/value cache up to their first removed position (:mod:`heedful.engine.reuse`: the same
    drops to float rounding, for less compute); ``rows``: a fixed number of copies per chunk.
    A set that removes nothing runs no pass and has drop 0. Every copy of every example runs
    through the batched runner, with a progress bar; special tokens and a fixed anchor such as a
    masked LM's ``[MASK]`` should not be removed (:func:`heedful.engine.perturb.removable_positions`).
    """
    bsz, _, width = remove.shape
    if bsz != len(problem) or width != problem.batch.seq_len:
        raise InputError(
            f"remove has shape {tuple(remove.shape)}, the problem's batch is {len(problem)} x {problem.batch.seq_len}",
            hint="give one [K, N] set of positions per example of the problem: [B, K, N]",
        )
    remove = remove.bool()
    example, which = remove.any(dim=2).nonzero(as_tuple=True)  # one copy per set that removes something
    with forward_precision(precision):
        original = problem.target.output(reference_logits(problem, precision), output)
        changed = removal_scores(problem, example, remove[example, which], output, removal=removal, reuse=reuse, rows=rows)
    drops = torch.zeros(remove.shape[:2], dtype=original.dtype, device=original.device)
    drops[example, which] = original[example] - changed.to(original)
    return drops


def token_means(remove: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Each token's mean of the ``values`` ``[B, K]`` of the sets ``remove`` ``[B, K, N]`` that
    hold it -> ``[B, N]``, 0 for a token in none (Captum's ``Occlusion``: the attribution of a
    feature covered by several windows is their mean drop)."""
    held = remove.bool()
    total = torch.where(held, values[:, :, None], torch.zeros((), dtype=values.dtype, device=values.device)).sum(dim=1)
    return total / held.sum(dim=1).clamp(min=1)


def sliding_windows(problem: Problem, window: int, stride: int = 1) -> torch.Tensor:
    """Windows of ``window`` consecutive removable tokens of every example, starting every
    ``stride`` tokens -> ``remove`` ``[B, K, N]`` (bool).

    The windows run over the removable tokens in reading order
    (:func:`heedful.engine.perturb.removable_positions`: special tokens and a fixed anchor are
    skipped, not counted), as Captum's ``Occlusion`` slides over its input: an example of ``M``
    removable tokens has ``max(ceil((M - window) / stride), 0) + 1`` windows, the last one cut
    at the end; a ``window`` longer than the example covers it whole. ``stride`` may not exceed
    ``window`` (a token between windows would never be removed). ``K`` is the most windows of
    any example; the others' surplus sets are empty.
    """
    if window < 1 or stride < 1:
        raise InputError(f"window={window} and stride={stride} must be at least 1", hint="e.g. window=3, stride=1")
    if stride > window:
        raise InputError(
            f"stride={stride} is larger than window={window}: the tokens between windows would never be removed",
            hint=f"use stride <= {window}",
        )
    allowed = removable_positions(problem.batch, problem.target)  # [B, N]
    bsz, seq = allowed.shape
    device = allowed.device
    counts = allowed.sum(dim=1)  # M_b
    width = max(int(counts.max()), 1) if bsz else 1
    windows = (torch.clamp(counts - window, min=0) + stride - 1) // stride + 1  # [B]
    most = int(windows.max()) if bsz else 1
    # the j-th removable token of each example, in reading order (stable sort keeps the order)
    order = torch.sort((~allowed).to(torch.int8), dim=1, stable=True).indices[:, :width]  # [B, M]
    feature = torch.arange(width, device=device)
    valid = feature[None, :] < counts[:, None]  # [B, M]
    start = torch.arange(most, device=device)[None, :, None] * stride  # [1, K, 1]
    inside = (feature[None, None, :] >= start) & (feature[None, None, :] < start + window)  # [1, K, M]
    inside = inside & valid[:, None, :] & (torch.arange(most, device=device)[None, :, None] < windows[:, None, None])
    column = torch.where(valid, order, torch.full_like(order, seq))  # padding features -> an extra column, cut off
    remove = torch.zeros(bsz, most, seq + 1, dtype=torch.bool, device=device)
    remove.scatter_(2, column[:, None, :].expand(-1, most, -1), inside)
    return remove[:, :, :seq]
