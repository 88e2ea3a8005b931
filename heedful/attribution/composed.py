"""One registered method's token scores inside another: ``hierarchical`` ranks sources by a
coarse method's scores, ``solvability_beam`` orders its first shortlist by a prior method's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from heedful.engine.problem import Problem
from heedful.errors import InputError, MethodError
from heedful.registry import MethodInfo, find


def named_method(name: str, role: str, task: str | None = None) -> MethodInfo:
    """The registered method ``name`` that a method's option ``role`` names (for ``task``), else
    an :class:`InputError` naming the option and the closest names."""
    try:
        return find(name, task)
    except MethodError as exc:
        raise InputError(f"{role}={name!r}: {exc.message}", hint=exc.fix) from None


def usable_method(name: str, problem: Problem, role: str) -> MethodInfo:
    """The registered method ``name`` that a method runs as its ``role`` (``"coarse"``,
    ``"prior"``) on ``problem``: one that takes the problem's task, provides what it needs on the
    problem's model and explains its target (a span only with a method that explains spans) --
    else an error naming the option, before any work (the model's refusal,
    :meth:`~heedful.adapters.ModelAdapter.refusal`, for what it lacks)."""
    adapter = problem.adapter
    info = named_method(name, role, adapter.task)
    gone = info.missing(adapter)
    if gone:
        raise adapter.refusal(f"{role}={name}", gone)
    if problem.target.is_span and not info.spans:
        raise InputError(f"the {role} method {name} explains one position, and the target is a span", hint=f"use {role}='grad_x_input'")
    return info


def method_scores(problem: Problem, info: MethodInfo, options: Mapping[str, Any] | None = None) -> torch.Tensor:
    """``info``'s token scores ``[B, N]`` of ``problem`` at its defaults updated by ``options``
    (its last layer's, for a layer-wise method), detached, on the problem's device. The method
    runs with autograd on whatever reference pass the problem holds (its own, when the problem
    was prepared for it) and the graph is released after it."""
    with torch.enable_grad():
        scores = info.fn(problem, **{**info.defaults, **(options or {})}).detach()
    problem.release_graph()
    return scores[:, -1] if scores.dim() == 3 else scores
