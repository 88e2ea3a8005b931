"""The ``precision`` option of forward-only methods (:mod:`heedful.engine.precision`)."""

from __future__ import annotations

from typing import Annotated

from heedful.engine.options import KEYED_WHEN_SET
from heedful.engine.precision import PrecisionChoice, Tolerates

MethodPrecision = Annotated[PrecisionChoice, KEYED_WHEN_SET, Tolerates()]
"""``precision``: ``"fp32"`` (default), ``"bf16"`` or ``"int8"`` forward passes, or ``"auto"``;
keyed in the results store only when not ``"fp32"``. ``"auto"`` stays at fp32: differences of
two nearly equal outputs (leave-one-out's ``f(x) - f(x \\ x_i)``) amplify bf16's rounding --
a token score moved by up to 0.71 of the example's largest fp32 score on 100 movie sentences
with minilm-sentiment (benchmarks/results/precision.md as of commit 5e8610f) -- and int8's more."""

SampledPrecision = Annotated[PrecisionChoice, KEYED_WHEN_SET, Tolerates(("bf16",))]
"""``precision`` of a sampling estimator (LIME, KernelSHAP, RISE): as :data:`MethodPrecision`,
but ``"auto"`` picks bf16 where the machine runs it faster than fp32 -- its deviations (for
LIME a largest score change of 0.02 of the largest score, token-score Spearman 0.9997 against
fp32, same run) lie well within the estimator's own sampling noise. int8 (Spearman 0.89) is
never chosen."""
