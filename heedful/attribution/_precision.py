"""The ``precision`` option of forward-only methods (:mod:`heedful.precision`)."""

from __future__ import annotations

from typing import Annotated

import torch

from heedful.options import KEYED_WHEN_SET
from heedful.precision import Precision
from heedful.problem import Problem, reference_pass

MethodPrecision = Annotated[Precision, KEYED_WHEN_SET]
"""``precision``: ``"fp32"`` (default), ``"bf16"`` or ``"int8"`` forward passes; keyed in the
results store only when not ``"fp32"``."""


@torch.no_grad()
def reference_logits(problem: Problem, precision: str) -> torch.Tensor:
    """The unperturbed logits at the anchors ``[B, C]`` at ``precision``: the problem's own
    reference pass at ``"fp32"``, else one more pass of the unperturbed inputs (to be called
    inside :func:`~heedful.precision.forward_precision`), so that a method's output differences
    compare passes of one precision."""
    if precision == "fp32":
        return problem.reference.logits.detach()
    return reference_pass(problem.adapter, problem.batch, problem.anchor, problem.inputs_embeds).logits
