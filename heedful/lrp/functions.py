"""The autograd functions through which LRP rules act.

Two styles, one per rule set:

* **Relevance form** (Chefer et al. 2021a's rules). The quantity sent backward *is* the
  relevance. Every operation on the path carries a :class:`DualRule` (or one of the small
  functions below) whose backward either returns the true gradient -- when the rules' state is in
  ``"gradient"`` mode -- or the rule's relevance for its inputs -- in ``"relevance"`` mode. One
  forward graph therefore serves both the ordinary backward (attention gradients) and the
  relevance pass, as Chefer's ``generate_LRP`` needs. Operations that only move values
  (reshape, transpose, index, adding a constant mask) pass relevance through unchanged, as
  they should.
* **Gradient × input form** (AttnLRP, Achtibat et al. 2024). The quantity sent backward is a
  modified gradient ``g`` such that the relevance of any tensor ``x`` is ``x * g``. Only the
  non-linear operations carry a function (:class:`ScaleGrad`, :class:`IdentityRule`,
  :class:`NormIdentity`); linear maps keep their ordinary gradient, which *is* the epsilon rule
  with a vanishing stabiliser.

Every function here returns its (module-computed) output unchanged in the forward pass, so
forward values are bit-identical to the unhooked model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

import torch
from torch.autograd import Function

from heedful.engine.precision import HALF, widened

GRADIENT = "gradient"
RELEVANCE = "relevance"
EPS = 1e-9
"""Stabiliser of :func:`safe_divide` (Chefer et al.'s value)."""


class ModeHolder(Protocol):
    mode: str


def safe_divide(a: torch.Tensor, b: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``a / (b + eps * sign(b))`` with 0 where ``b == 0`` (sign(0) taken as +1), in ``b``'s dtype."""
    den = torch.where(b >= 0, b + eps, b - eps)
    return torch.where(b == 0, torch.zeros_like(a), a / den)


def in_float32(rule: Callable, grad: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | None, ...]:
    """``rule(grad, *inputs)`` -- one relevance per input -- computed in float32 when the model
    runs in half precision (its divisions of small sums lose everything in bfloat16's 8-bit
    mantissa), each result returned in its input's dtype (autograd's)."""
    if grad.dtype not in HALF and all(i.dtype not in HALF for i in inputs):
        return tuple(rule(grad, *inputs))
    found = rule(widened(grad), *(widened(i) for i in inputs))
    return tuple(None if r is None else r.to(i.dtype) for r, i in zip(found, inputs, strict=True))


class DualRule(Function):
    """``DualRule.apply(state, relprop, output, *inputs)`` returns ``output``.

    Backward in ``"gradient"`` mode: the incoming gradient goes to ``output`` (and on through
    the operation's real graph). In ``"relevance"`` mode: ``relprop(R, *inputs)`` gives the
    relevance of each input; the real graph is not traversed.
    """

    @staticmethod
    def forward(ctx, state: ModeHolder, relprop: Callable, output: torch.Tensor, *inputs: torch.Tensor):
        ctx.state = state
        ctx.relprop = relprop
        ctx.save_for_backward(*inputs)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        inputs = ctx.saved_tensors
        if ctx.state.mode == GRADIENT:
            return (None, None, grad, *([None] * len(inputs)))
        return (None, None, None, *in_float32(ctx.relprop, grad, inputs))


class ResidualSplit(Function):
    """Marks the branch term ``a`` of a residual sum ``s = a + r`` (or ``s = a + o_1 + ... + r``
    with further terms ``o_i``, computed before ``a``): returns ``a``.

    ``s``'s relevance ``R`` reaches every term unchanged through the addition; in
    ``"relevance"`` mode this function turns ``a``'s copy into ``R_a`` and sends ``R_t - R`` to
    every other term ``t``, so that each ends up with its ``R_t`` --
    ``(R_a, R_o1, ..., R_r) = rule(R, a, o_1, ..., r)``.
    """

    @staticmethod
    def forward(ctx, state: ModeHolder, rule: Callable, a: torch.Tensor, *others: torch.Tensor):
        ctx.state = state
        ctx.rule = rule
        ctx.save_for_backward(a, *others)
        return a.view_as(a)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        count = len(ctx.saved_tensors) - 1
        if ctx.state.mode == GRADIENT:
            return None, None, grad, *([None] * count)
        return None, None, *in_float32(partial(_split, ctx.rule), grad, ctx.saved_tensors)


def _split(rule: Callable, grad: torch.Tensor, *terms: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:class:`ResidualSplit`'s backward: ``R_a``, and ``R_t - R`` for every other term."""
    rel_a, *rest = rule(grad, *terms)
    return rel_a, *(r - grad for r in rest)


class SegmentStart(Function):
    """Start (input side) of a linear segment handled by the z-rule through its gradient:
    relevance ``x * g`` (see :class:`SegmentEnd`). Identity in ``"gradient"`` mode."""

    @staticmethod
    def forward(ctx, state: ModeHolder, x: torch.Tensor):
        ctx.state = state
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.state.mode == GRADIENT:
            return None, grad
        (x,) = ctx.saved_tensors
        return None, x * grad


class SegmentEnd(Function):
    """End (output side) of a linear, bias-free segment ``y = J x`` (rotary position embedding):
    in ``"relevance"`` mode sends ``R / y`` back, so that the ordinary gradient through the
    segment followed by :class:`SegmentStart` gives the z-rule ``x * J^T (R / y)``."""

    @staticmethod
    def forward(ctx, state: ModeHolder, y: torch.Tensor):
        ctx.state = state
        ctx.save_for_backward(y)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.state.mode == GRADIENT:
            return None, grad
        (y,) = ctx.saved_tensors
        return None, safe_divide(grad, y)


# ---------------------------------------------------------------------- gradient x input form
class ScaleGrad(Function):
    """Identity forward; gradient times ``factor`` (AttnLRP's uniform rule, Eq. 7, for the
    operands of a product: ``factor = 1/2`` per bilinear product passed)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


class IdentityRule(Function):
    """Element-wise non-linearity ``y = f(x)`` under the identity rule (AttnLRP Eq. 9):
    relevance passes unchanged, i.e. the gradient becomes ``g * y / x``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor):
        # y / x; where x = 0 the activations here have f(0) = 0: the 0/0 becomes 0
        ctx.save_for_backward(torch.nan_to_num_(y / x, nan=0.0, posinf=0.0, neginf=0.0))
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ratio,) = ctx.saved_tensors
        return grad * ratio, None


class NormIdentity(Function):
    """LayerNorm / RMSNorm with the normalising scale treated as a constant (AttnLRP's identity
    rule on the division; the remaining map is linear and keeps its gradient).

    LayerNorm ``y = (x - mean x) / s * w + b``: ``g_x = (w g - mean(w g)) / s``.
    RMSNorm ``y = x / s * w``: ``g_x = w g / s``. ``s`` is computed from ``x`` and ``eps``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor, kind: str, eps: float, weight: torch.Tensor | None):
        xf = x.float()
        if kind == "layernorm":
            scale = (xf.var(dim=-1, keepdim=True, unbiased=False) + eps).sqrt()
        else:
            scale = (xf.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()
        ctx.kind = kind
        ctx.dtype = x.dtype
        ctx.has_weight = weight is not None
        ctx.save_for_backward(scale, *((weight,) if weight is not None else ()))
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scale, *rest = ctx.saved_tensors
        g = grad.float()
        if ctx.has_weight:
            g = g * rest[0].float()
        if ctx.kind == "layernorm":
            g = g - g.mean(dim=-1, keepdim=True)
        return (g / scale).to(ctx.dtype), None, None, None, None
