"""What each route computes, from a loaded model and validated options: the library's own
calls (``Model.explain``, ``Model.explain_generation``, :func:`heedful.evaluate.evaluate`) and
renderers, turned into JSON-ready dicts."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from heedful.errors import HeedfulError, InputError
from heedful.explanation import Explanation
from heedful.model import Model
from heedful.registry import MethodInfo

Report = Callable[[str], None]
"""``report(stage)``: one more step of the job has begun."""

CURVE_METRICS = ("deletion", "aopc", "sufficiency")
"""Per-example faithfulness under the default protocol: the deletion curve (the watched output
as the top fraction of tokens is removed), AOPC (comprehensiveness) and sufficiency."""


def number(value: Any) -> float | None:
    """A float for JSON: ``None`` for NaN and infinities."""
    value = float(value)
    return value if math.isfinite(value) else None


def numbers(values: Any) -> list[float | None]:
    return [number(v) for v in np.asarray(values, dtype=float).ravel()]


# ---------------------------------------------------------------------------- explain
def steps_of_explain(methods: int, curve: bool) -> int:
    """How many progress steps :func:`explain` reports (one per method, one per curve)."""
    return methods * (2 if curve else 1)


def explain(
    model: Model, text: str, target: str | int | None, runs: Sequence[tuple[MethodInfo, dict[str, Any]]], curve: bool, report: Report
) -> dict[str, Any]:
    """``POST /api/explain``: every method's explanation of ``text`` for ``target`` (None: the
    prediction), its word scores, cost and, with ``curve``, its deletion curve, AOPC and
    sufficiency on this example; the Spearman agreement of the methods' token scores; the
    rendered HTML of every explanation."""
    from heedful.render.html import explanation_fragment

    found: list[Explanation] = []
    for info, options in runs:
        report(f"explaining with {info.name}")
        found.append(model.explain(text, info.name, target, **options))
    measured = []
    for expl in found:
        if curve:
            report(f"measuring the deletion curve of {expl.method}")
        measured.append(faithfulness(model, expl) if curve else None)
    first = found[0]
    words = first.words("sum")
    return {
        "model": model.name,
        "text": text,
        "tokens": list(first.tokens),
        "special": [bool(s) for s in first.special],
        "words": list(words.words),
        "truncated": bool(first.truncated),
        "target": {"label": first.target.label, "index": first.target.indices[0] if len(first.target.indices) == 1 else None},
        "prediction": prediction(first.prediction),
        "methods": [method_view(e, m) for e, m in zip(found, measured, strict=True)],
        "agreement": agreement([e.scores for e in found], first.special),
        "html": "".join(explanation_fragment(e) for e in found),
    }


def prediction(predicted: dict[str, Any]) -> dict[str, Any]:
    """The model's prediction as ``{"label", "probability"}`` (regression: label ``value`` and
    the ``value``; a contrast: the log-probability difference as ``value``)."""
    label = predicted.get("label", "value")
    found: dict[str, Any] = {"label": None if label is None else str(label), "probability": None}
    if "probability" in predicted:
        found["probability"] = number(predicted["probability"])
    for key in ("value", "log_probability_difference"):
        if key in predicted:
            found["value"] = number(predicted[key])
    return found


def method_view(expl: Explanation, measured: dict[str, Any] | None) -> dict[str, Any]:
    words = expl.words("sum")
    return {
        "name": expl.method,
        "options": expl.options,
        "scores": numbers(expl.scores),
        "word_scores": numbers(words.scores),
        "seconds": number(expl.cost.seconds),
        "cost": {"forward": int(round(expl.cost.forward_passes)), "backward": int(round(expl.cost.backward_passes))},
        "curve": None if measured is None else measured["curve"],
        "aopc": None if measured is None else measured["aopc"],
        "sufficiency": None if measured is None else measured["sufficiency"],
        **({} if measured is None or measured.get("note") is None else {"curve_note": measured["note"]}),
    }


def faithfulness(model: Model, expl: Explanation) -> dict[str, Any]:
    """The deletion curve (fractions of the rankable tokens removed, top-scored first, and the
    watched output there), AOPC and sufficiency of one explanation under the default protocol
    (:func:`heedful.evaluate.evaluate`). A target the protocol cannot measure gives ``None``
    values and a ``note`` saying why."""
    from heedful.evaluate import evaluate

    try:
        results = evaluate(model, [expl], list(CURVE_METRICS))
    except HeedfulError as exc:
        return {"curve": None, "aopc": None, "sufficiency": None, "note": f"no deletion curve for this target ({exc.message})"}
    deletion = results["deletion"]
    curve = None
    if deletion.per_example.curves is not None and deletion.x is not None:
        curve = {"fraction": numbers(deletion.x), "value": numbers(deletion.per_example.curves[0])}
    return {
        "curve": curve,
        "aopc": number(results["aopc"].per_example.values[0]),
        "sufficiency": number(results["sufficiency"].per_example.values[0]),
        "note": None,
    }


def agreement(scores: Sequence[np.ndarray], special: Sequence[bool]) -> list[list[float | None]]:
    """``[M, M]`` Spearman rank correlation between the methods' scores of the non-special
    tokens (``None`` where a method's scores are constant)."""
    import pandas as pd

    keep = ~np.asarray(special, dtype=bool)
    frame = pd.DataFrame({i: np.asarray(s, dtype=float)[keep] for i, s in enumerate(scores)})
    matrix = frame.corr(method="spearman").to_numpy()
    return [numbers(row) for row in matrix]


# ---------------------------------------------------------------------------- curve
def curve(model: Model, text: str, target: str | int | None, info: MethodInfo, options: dict[str, Any], report: Report) -> dict[str, Any]:
    """``POST /api/curve``: one method's deletion curve, AOPC and sufficiency on ``text``."""
    report(f"explaining with {info.name}")
    expl = model.explain(text, info.name, target, **options)
    report(f"measuring the deletion curve of {info.name}")
    measured = faithfulness(model, expl)
    found = measured["curve"] or {"fraction": [], "value": []}
    return {
        "method": info.name,
        "fraction": found["fraction"],
        "value": found["value"],
        "aopc": measured["aopc"],
        "sufficiency": measured["sufficiency"],
        **({} if measured["note"] is None else {"curve_note": measured["note"]}),
    }


# ---------------------------------------------------------------------------- generate
def generate(model: Model, prompt: str, max_new_tokens: int, info: MethodInfo, options: dict[str, Any], report: Report) -> dict[str, Any]:
    """``POST /api/generate``: what a causal language model writes after ``prompt`` (greedy, at
    most ``max_new_tokens``), every generated token explained over the tokens before it."""
    from heedful.render.generation import generation_snippet

    if model.task != "causal_lm":
        raise InputError(
            f"{model.name} is a {model.task} model; generation needs a causal language model",
            hint="pick a language model (task causal_lm in GET /api/models)",
        )
    report(f"generating and explaining with {info.name}")
    found = model.explain_generation(prompt, info.name, max_new_tokens=max_new_tokens, **options)
    return {
        "model": model.name,
        "prompt": prompt,
        "method": info.name,
        "source_tokens": list(found.tokens),
        "special": [bool(s) for s in found.special],
        "prompt_length": int(found.prompt_length),
        "generated": list(found.generated_tokens),
        "matrix": [numbers(row) for row in found.scores],
        "probabilities": numbers(found.probabilities),
        "seconds": number(found.cost.seconds * found.steps + found.generation_seconds),
        "html": generation_snippet(found),  # its style and hover script with it: the page runs them
    }
