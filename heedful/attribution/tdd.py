"""TDD: token distribution dynamics (Feng et al. 2024, "Unveiling and Manipulating Prompt
Influence in Large Language Models", ICLR; reference code zijian678/TDD ``TDD_step1.py``).

A token's saliency is how much the explained output distribution changes when the token is
appended to the context:

- **forward**: ``d_i`` = output after the prefix ending with token ``i``; ``I_i = d_i - d_{i-1}``.
  For decoders one pass gives every prefix (the head applied at every position); otherwise the
  prefixes are run as deletions of the later tokens (batched).
- **backward**: ``b_i`` = output on the suffix made of the last ``i`` tokens; the token that the
  ``i``-th suffix adds gets ``b_i - b_{i-1}``.
- **bidirectional**: the mean of the two (the reference's ``ours_add``).

The output is the contrastive score ``softmax([l_target, l_foil])[0] - [1]`` (=
``tanh((l_target - l_foil) / 2)``) for a contrastive target ``"A vs B"``, as in the paper. For
any other target we use the target's probability under the full softmax (non-contrastive
variant: ours), and the value for regression. Special tokens are never removed and score 0;
``d_0`` / ``b_0`` (no content token) is the output on the special tokens alone, or 0 when
nothing would remain (e.g. GPT-2 without a BOS token, where the reference also starts at 0).
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from heedful.attribution._masks import Features, features_of, perturbed_rows, to_tokens
from heedful.engine.options import AT_LEAST_ONE, RUNTIME
from heedful.engine.problem import Problem
from heedful.engine.runner import Copies, Runner
from heedful.engine.targets import ResolvedTarget
from heedful.registry import register

Direction = Literal["forward", "backward", "bidirectional"]


def is_contrast(target: ResolvedTarget) -> bool:
    return target.classes.shape[1] == 2 and target.task != "regression"


def tdd_output(target: ResolvedTarget, logits: torch.Tensor) -> torch.Tensor:
    """TDD's scalar per row ``[R]`` from logits ``[R, C]`` (see the module docstring)."""
    if target.task == "regression":
        return target.score(logits.float())
    if is_contrast(target):
        return torch.tanh(target.score(logits.float()) / 2)
    return target.score(torch.softmax(logits.float(), dim=-1))


def _row_scores(problem: Problem, features: Features, keep: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """TDD output for keep-patterns ``keep`` ``[B, M + 1, M]`` with deletion -> ``[B, M + 1]``;
    rows with nothing left to run (all features gone, no special token) give 0."""
    batch = problem.batch
    bsz, steps, width = keep.shape
    kept = (keep & features.valid[:, None, :]).sum(dim=2)
    remaining = batch.lengths[:, None] - features.counts[:, None] + kept  # tokens left per row
    run = (torch.arange(steps, device=remaining.device)[None, :] <= features.counts[:, None]) & (remaining > 0)
    example, step = run.nonzero(as_tuple=True)
    perturbed = perturbed_rows(problem, features, keep[example, step], example, "delete")
    runner = Runner.for_problem(problem, rows=chunk)
    values = runner.map(Copies.of(perturbed, example), lambda part, fwd: tdd_output(part.target, fwd.logits))
    out = torch.zeros(bsz, steps, device=values.device)
    out[example, step] = values.float()
    return out


def _prefix_one_pass(problem: Problem, features: Features) -> torch.Tensor | None:
    """``d`` ``[B, M + 1]`` from one forward for causal decoders whose special tokens all come
    before the content (then the prefix ending at a token is exactly what its position sees);
    ``None`` when that does not hold, or when the head is known only through the model's own
    outputs (then the prefixes run as deletions)."""
    adapter, batch, target = problem.adapter, problem.batch, problem.target
    if not adapter.is_decoder or target.anchor_kind != "last" or not adapter.provides("head"):
        return None
    positions = torch.arange(batch.seq_len, device=batch.input_ids.device)[None, :]
    first = torch.where(features.valid, features.positions, batch.seq_len).amin(dim=1)
    late_special = (batch.special_mask & (positions > first[:, None])).any()
    if late_special:
        return None
    h = problem.reference_with(hidden_states=True).hidden_states[-1]  # [B, N, D], final norm included
    bsz, seq, dim = h.shape
    logits = adapter.head_at_layer(h.reshape(bsz * seq, dim), adapter.num_layers)
    per_pos = tdd_output(target.repeat(seq), logits).view(bsz, seq)
    d = torch.zeros(bsz, features.width + 1, device=per_pos.device)
    pos = features.positions.clamp_min(0)
    d[:, 1:] = torch.where(features.valid, per_pos.gather(1, pos), torch.zeros_like(per_pos[:, :1]))
    before = first - 1  # a BOS (or other leading special) gives d_0
    has_before = before >= 0
    d[:, 0] = torch.where(has_before, per_pos.gather(1, before.clamp_min(0)[:, None])[:, 0], torch.zeros(bsz, device=per_pos.device))
    return d


def _passes(direction: str, tokens: int) -> tuple[float, float]:
    """The reference and ``tokens + 1`` prefix or suffix copies per direction: an encoder's count
    (a decoder reads every prefix off the reference pass, so its forward direction costs one
    pass: this is an upper bound there)."""
    return (1 + (tokens + 1) * (2 if direction == "bidirectional" else 1), 0)


@register(
    "tdd",
    family="perturbation",
    cost="forward: 1 forward (decoders) or N+1; backward: N+1; bidirectional: both (batched)",
    passes=lambda o, n: _passes(o["direction"], n),
    needs_hidden=True,  # decoders read every prefix off the reference pass
)
@torch.no_grad()
def tdd(
    problem: Problem,
    *,
    direction: Direction = "bidirectional",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Change of the (contrastive) output distribution as each token joins the prefix / suffix.

    TDD saliency per content token ``[B, N]`` (special tokens and a fixed anchor 0).

    ``direction``: ``"forward"``, ``"backward"`` or ``"bidirectional"`` (mean of both; the
    reference's best variant). Use a contrastive target (``"A vs B"``) for the paper's
    target/foil score.

    Source: Feng et al. 2024, Unveiling and Manipulating Prompt Influence in LLMs (TDD, ICLR)
    """
    batch = problem.batch
    features = features_of(batch, problem.target)
    width = features.width
    steps = torch.arange(width + 1, device=features.counts.device)[:, None]
    feat = torch.arange(width, device=features.counts.device)[None, :]
    counts = features.counts
    total = torch.zeros(len(batch), width, device=features.counts.device)
    if direction in ("forward", "bidirectional"):
        d = _prefix_one_pass(problem, features)
        if d is None:
            prefix_keep = (feat < steps)[None].expand(len(batch), -1, -1)  # row i keeps the first i
            d = _row_scores(problem, features, prefix_keep, internal_batch_size)
        total += d[:, 1:] - d[:, :-1]
    if direction in ("backward", "bidirectional"):
        # row i keeps the last i features of each example
        suffix_keep = feat[None] >= (counts[:, None, None] - steps[None])
        b = _row_scores(problem, features, suffix_keep, internal_batch_size)
        i = (counts[:, None] - feat).clamp(min=1, max=width)  # suffix length that adds feature f
        total += b.gather(1, i) - b.gather(1, i - 1)
    if direction == "bidirectional":
        total /= 2
    return to_tokens(features, total * features.valid, batch.seq_len)
