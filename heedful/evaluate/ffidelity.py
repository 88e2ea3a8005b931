"""F-Fidelity (Zheng et al. 2024, "F-Fidelity: A Robust Framework for Faithfulness Evaluation of
Explainable AI", §4): removal curves measured on a copy of the model fine-tuned with random
removal, so that removing tokens is in distribution for the model being measured.

Two parts, both explanation-agnostic:

* the **fine-tuned copy**: the classifier trained further on its training texts with a random
  ``U(0, beta)`` share of each text's tokens removed by the evaluation's operator (built into the
  zoo as ``minilm-sentiment-ffidelity``: ``heedful models build minilm-sentiment-ffidelity``;
  :class:`heedful.zoo.train.RemovalTrainConfig`). No explanation takes part in it, unlike ROAR's
  retraining, so no method's rankings leak into the evaluator;
* **stochastic removal**: at ratio ``alpha`` the explanation's top ``floor(alpha n)`` tokens
  are not all removed; ``S`` times, a uniformly drawn subset of at most ``floor(beta n)`` of
  them is (``n``: the protocol's count base), so no perturbed input removes more than the
  fine-tuning showed the model. FFid+ (Eq. 5) averages ``f(x) - f(x \\ m)`` over draws and
  ratios (higher: more faithful); FFid- (Eq. 6) does the same with the draws taken from the
  tokens *outside* the top ``alpha`` (lower: more faithful). ``f`` is the protocol's watched
  output of the fine-tuned copy for the class the explanation explains.

Draws: one uniform key per (draw, position) for each example, from a generator seeded with
:data:`FFID_SEED` (the same keys at every ratio, independent of the batch); a subset is the
``k`` candidates with the smallest keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from heedful.errors import InputError
from heedful.evaluate import perturbation as pert
from heedful.evaluate.metrics import PerExample, Summary, mean_aggregate
from heedful.evaluate.protocol import Protocol, get_protocol
from heedful.explanation import Explanation

FFID_BETA = 0.5
"""The largest share of a text removed in fine-tuning and in any evaluation draw (Zheng et al.
use beta = 0.1 .. 0.5 by modality; movie snippets are ~10 words, so one word is 0.1)."""
FFID_SAMPLES = 8
"""Draws ``S`` per (example, ratio)."""
FFID_SEED = 0


@dataclass
class FFidelity:
    """FFid+ and FFid- of a set of explanations: per example ``[B]`` with curves ``[B, R]``
    (:class:`~heedful.evaluate.metrics.PerExample`), their means with 95 % bootstrap intervals,
    and the curves' ratios ``x`` ``[R]``."""

    plus: PerExample
    minus: PerExample
    plus_summary: Summary
    minus_summary: Summary
    x: np.ndarray


def draw_keys(n_examples: int, width: int, samples: int) -> torch.Tensor:
    """``[B, S, width]`` uniform keys, each example's from its own seeded generator (so values
    do not depend on the batch an example is measured in)."""
    return torch.stack(
        [torch.rand(samples, width, generator=torch.Generator().manual_seed(FFID_SEED), dtype=torch.float64) for _ in range(n_examples)]
    )


def stochastic_masks(candidates: torch.Tensor, budget: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``[B, R, S, N]``: per draw, the ``min(|candidates|, budget)`` candidate positions with the
    smallest keys. ``candidates`` ``[B, R, N]`` bool; ``budget`` ``[B]`` (``floor(beta n)``);
    ``keys`` ``[B, S, N]``."""
    key = torch.where(candidates[:, :, None, :], keys[:, None, :, :], torch.full_like(keys[:, None, :, :], torch.inf))
    rank = key.argsort(dim=-1, stable=True).argsort(dim=-1)  # [B, R, S, N] rank of each position's key
    return candidates[:, :, None, :] & (rank < budget[:, None, None, None])


@torch.no_grad()
def _drops(prepared: pert.Prepared, mode: str, beta: float, samples: int, chunk: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Curves ``[B, R]`` of the mean output drop over draws, ratios ``x`` ``[R]`` and valid ``[B, R]``."""
    x, sizes, valid = pert.rationale_sizes(prepared)
    candidates = pert.removal_masks(prepared, sizes, mode)  # [B, R, N]
    budget = torch.floor(prepared.base.to(torch.float64) * beta).long()
    width = prepared.batch.seq_len
    keys = draw_keys(len(prepared), max(int(prepared.adapter.max_length), width), samples)[:, :, :width]
    masks = stochastic_masks(candidates, budget, keys)  # [B, R, S, N]
    bsz, n_ratios = sizes.shape
    drops = np.zeros((bsz, n_ratios, samples))
    todo = valid[:, :, None] & masks.any(dim=3)  # an empty draw leaves the output as it was
    if todo.any():
        ex, ratio, draw = todo.nonzero(as_tuple=True)
        rows = pert.forward_removed(prepared, ex, masks[ex, ratio, draw], prepared.protocol.removal, chunk)
        drops[ex.numpy(), ratio.numpy(), draw.numpy()] = prepared.original.output[ex.numpy()] - rows.output
    curves = np.where(valid.numpy(), drops.mean(axis=2), np.nan)
    return x, curves, valid.numpy()


def f_fidelity(
    finetuned,
    explanations: Sequence[Explanation],
    protocol: str | Protocol | None = None,
    beta: float = FFID_BETA,
    samples: int = FFID_SAMPLES,
    batch_size: int = 32,
    chunk: int | None = None,
) -> FFidelity:
    """FFid+ and FFid- (module docstring) of ``explanations`` -- computed on the original model,
    whose tokenizer the fine-tuned copy shares -- measured on ``finetuned`` (a
    :class:`heedful.Model` or adapter fine-tuned with random removal by the protocol's operator)."""
    adapter = getattr(finetuned, "adapter", finetuned)
    if adapter.task != "classification":
        raise InputError("F-Fidelity is defined for classifiers", hint="evaluate a sequence classifier")
    if not 0.0 < beta <= 1.0:
        raise InputError(f"beta must lie in (0, 1], got {beta}", hint=f"e.g. beta={FFID_BETA}")
    if samples < 1:
        raise InputError(f"samples must be at least 1, got {samples}")
    protocol = get_protocol(protocol).resolved(adapter.device)
    parts: dict[str, list[np.ndarray]] = {"remove": [], "keep": []}
    x = protocol.curve_ratios
    for start in range(0, len(explanations), batch_size):
        prepared = pert.prepare(adapter, explanations[start : start + batch_size], protocol, chunk)
        for mode in parts:
            x, curves, _ = _drops(prepared, mode, beta, samples, chunk)
            parts[mode].append(np.where(prepared.kept[:, None], curves, np.nan))
    found = []
    for mode in ("remove", "keep"):
        curves = np.concatenate(parts[mode])
        mask = protocol.mean_mask[None, :] & np.isfinite(curves)
        with np.errstate(invalid="ignore"):
            values = np.where(mask.any(axis=1), np.where(mask, curves, 0.0).sum(axis=1) / mask.sum(axis=1), np.nan)
        found.append(PerExample(values, curves))
    return FFidelity(found[0], found[1], mean_aggregate(found[0], protocol), mean_aggregate(found[1], protocol), np.asarray(x))
