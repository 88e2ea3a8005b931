"""What ``POST /api/trace`` and ``POST /api/steer`` compute: the library's causal trace
(:func:`heedful.inside.tracing.trace`) and contrastive steering vector
(:func:`heedful.inside.steering.contrastive`), turned into JSON-ready dicts for the page."""

from __future__ import annotations

from typing import Any

import numpy as np

from heedful.model import Model
from heedful.render.colors import Scale
from heedful.serve.compute import Report

TRACE_KINDS = ("residual", "attn", "mlp")
"""What a page trace restores (a head grid has heads, not tokens, as its columns)."""


def colors(values: np.ndarray | None) -> list[list[str | None]] | None:
    """``[L, K]`` background colours of a grid on the renderers' one scale
    (:class:`heedful.render.colors.Scale`, as ``heedful trace --html``); ``None`` for blank cells."""
    if values is None:
        return None
    scale = Scale.fit(values)
    return [["rgb({},{},{})".format(*scale.rgb(float(v))) if np.isfinite(v) else None for v in row] for row in values]


def trace(
    model: Model, prompt: str, *, corrupt: str | None, counterfactual: str | None, target: str | None,
    kind: str, window: int, samples: int, report: Report,
) -> dict[str, Any]:
    """``POST /api/trace``: the layer x position grid of indirect effects (``effect`` ``[L, N]``,
    columns the prompt's decoded tokens), attribution patching's grid (``atp``) and their
    Spearman correlation, as :meth:`heedful.inside.tracing.Trace.to_dict`, with each grid's
    colours (``effect_colors``, ``atp_colors``)."""
    from heedful.inside.tracing import trace as run_trace

    report(f"tracing {kind} with {samples if counterfactual is None else 1} corrupted run(s)")
    found = run_trace(model, prompt, corrupt=corrupt, counterfactual=counterfactual, target=target, kind=kind, window=window, samples=samples)
    return {**found.to_dict(), "model": model.name, "effect_colors": colors(found.effect), "atp_colors": colors(found.atp)}


def steer(
    model: Model, prompt: str, positive: str, negative: str, layer: int, coefficient: float, max_new_tokens: int, report: Report,
) -> dict[str, Any]:
    """``POST /api/steer``: greedy continuations of ``prompt`` without and with ``coefficient``
    times the contrastive activation addition vector of ``positive`` minus ``negative`` at the
    output of block ``layer`` (:func:`heedful.inside.steering.contrastive`)."""
    from heedful.inside.steering import contrastive

    report(f"reading the vector at block {layer}")
    vector = contrastive(model, positive, negative, layer)
    report("generating without and with the vector")
    plain = model.generate(prompt, max_new_tokens)
    steered = vector.generate(model, prompt, coefficient, max_new_tokens)
    decode = model.tokenizer.decode
    return {
        "model": model.name,
        "prompt": prompt,
        "where": vector.where,
        "layer": vector.layer,
        "coefficient": coefficient,
        "norm": float(vector.vector.norm()),
        "without": decode(plain.continuations[0], skip_special_tokens=True),
        "with": decode(steered.continuations[0], skip_special_tokens=True),
    }
