"""Lower-precision forward passes: the numeric precision a forward-only computation runs at.

Perturbation methods (leave-one-out, LIME, KernelSHAP, RISE) and the faithfulness curves only
run the model forward and read its outputs, so they can trade a little accuracy for speed:

* ``"fp32"`` -- the model as loaded (the default; every result reported unless asked).
* ``"bf16"`` -- a bfloat16 copy of the model: weights and activations in bfloat16, layer norms
  and softmax accumulating in float32 inside their kernels. On CPUs with AVX-512 BF16 (or AMX)
  the matrix products run at about twice the float32 rate. (Casting only the linear layers'
  weights, with float32 activations between them, was measured too: half the speed-up, for
  a third of the deviation; see benchmarks/results/precision.md.)
* ``"int8"`` -- a copy whose linear layers are dynamically quantised to int8
  (:func:`torch.ao.quantization.quantize_dynamic`: int8 weights per tensor, activations
  quantised per batch; CPU only).

:func:`forward_precision` sets the precision for the passes run inside it (a context
variable: other threads and tasks keep theirs); an adapter asked for a forward pass at a lower
precision runs it on its low-precision copy (:func:`lowered_model`, built once per adapter and
precision and then reused). Outputs come back in float32 whatever the precision.

>>> import torch
>>> from heedful.precision import lowered_model
>>> layer = torch.nn.Sequential(torch.nn.Linear(4, 2))
>>> lowered_model(layer, "bf16")(torch.ones(1, 4, dtype=torch.bfloat16)).dtype
torch.bfloat16
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

import torch
from torch import nn

from heedful.errors import InputError

PRECISIONS = ("fp32", "bf16", "int8")
Precision = Literal["fp32", "bf16", "int8"]
"""The type of a ``precision`` option (see the module docstring)."""

_ACTIVE: ContextVar[str] = ContextVar("heedful_precision", default="fp32")


def check_precision(precision: str) -> str:
    """``precision`` when it is one of :data:`PRECISIONS`; an :class:`InputError` otherwise."""
    if precision not in PRECISIONS:
        raise InputError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}", hint="use fp32, bf16 or int8")
    return precision


def active_precision() -> str:
    """The precision forward passes run at here (``"fp32"`` outside :func:`forward_precision`)."""
    return _ACTIVE.get()


@contextmanager
def forward_precision(precision: str) -> Iterator[None]:
    """Forward passes inside run at ``precision`` (the adapter's low-precision copy of its model).

    Only forward passes without gradients belong inside: the low-precision copies serve no
    backward pass.
    """
    token = _ACTIVE.set(check_precision(precision))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def lowered_model(model: nn.Module, precision: str) -> nn.Module:
    """A copy of ``model`` for forward passes at ``precision`` (``model`` itself is untouched):
    ``"bf16"`` in bfloat16 (its inputs' embeddings must be bfloat16 too), ``"int8"`` with every
    ``nn.Linear`` dynamically quantised (CPU only); ``"fp32"`` returns ``model``."""
    check_precision(precision)
    if precision == "fp32":
        return model
    device = next(model.parameters()).device
    if precision == "int8" and device.type != "cpu":
        raise InputError(f"precision int8 runs on the CPU only; the model is on {device}", hint="use precision='bf16'")
    lowered = copy.deepcopy(model).eval()
    if precision == "bf16":
        lowered = lowered.to(torch.bfloat16)
    else:
        with warnings.catch_warnings():  # torch.ao's deprecation notices: the eager API is what runs here
            warnings.simplefilter("ignore")
            lowered = torch.ao.quantization.quantize_dynamic(lowered, {nn.Linear}, dtype=torch.qint8)
    for p in lowered.parameters():
        p.requires_grad_(False)
    return lowered
