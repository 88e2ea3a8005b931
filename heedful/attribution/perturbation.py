"""Perturbation methods that remove tokens and watch the output."""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from heedful.attribution._precision import MethodPrecision, reference_logits
from heedful.engine.options import AT_LEAST_ONE, RUNTIME
from heedful.engine.perturb import Removal, removable_positions, remove_from_examples
from heedful.engine.precision import forward_precision
from heedful.engine.problem import Problem
from heedful.engine.runner import Copies, Runner
from heedful.registry import register

Output = Literal["logit", "probability"]


@register("leave_one_out", family="perturbation", cost="1 + N forwards (batched)", passes=lambda o, n: (1 + n, 0))
@torch.no_grad()
def leave_one_out(
    problem: Problem,
    *,
    removal: Removal = "auto",
    output: Output = "logit",
    precision: MethodPrecision = "fp32",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Output drop when each token alone is removed (replaced by [MASK], or deleted for causal LMs).

    ``LOO_i = f(x) - f(x \\ x_i)`` for every removable token; 0 for special tokens ``[B, N]``.

    ``removal="auto"`` uses the model's removal token (``[MASK]`` for encoders; deletion for
    causal LMs); ``output`` chooses the target logit or its probability as ``f``. All ``sum_b
    N_b`` perturbed copies run through the batched runner, at ``precision`` (``"bf16"`` /
    ``"int8"``: :mod:`heedful.engine.precision`; ``f(x)`` then runs at that precision too).

    Source: Li et al. 2016, Understanding Neural Networks through Representation Erasure (Eq. 2)
    """
    batch, target = problem.batch, problem.target
    allowed = removable_positions(batch, target)
    example, position = allowed.nonzero(as_tuple=True)  # one perturbed copy per removable token
    rows = example.shape[0]
    remove = torch.zeros(rows, batch.seq_len, dtype=torch.bool, device=example.device)
    remove[torch.arange(rows, device=remove.device), position] = True
    perturbed = remove_from_examples(problem.adapter, batch, target, example, remove, removal)
    with forward_precision(precision):
        original = target.output(reference_logits(problem, precision), output)
        changed = Runner.for_problem(problem, rows=internal_batch_size).scores(Copies.of(perturbed, example), output)
    scores = torch.zeros(batch.input_ids.shape, dtype=original.dtype, device=original.device)
    scores[example, position] = original[example] - changed
    return scores
