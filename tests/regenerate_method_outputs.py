"""The golden outputs that hold every method's ``version``: ``tests/data/method_outputs.json``.

For every registered method (:func:`heedful.methods`) the file holds its ``version`` and its
scores on :data:`SENTENCES` with the tests' tiny seeded BERT classifier and Llama causal LM
(``tests/conftest.py::cached_model``), under the cheap options it records (few steps and
samples for the iterative and sampling methods, a fixed head mask for Mask-LRP).
``tests/test_method_versions.py`` recomputes them: a method whose outputs moved while its
version did not fails, and so does a version the file does not know.

After changing what a method computes, bump ``version=`` in its ``@register(...)`` (stored
results of the old version are then never reused) and run::

    .venv/bin/python tests/regenerate_method_outputs.py
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from conftest import cached_model  # noqa: E402  (tests/ on the path first)

import heedful  # noqa: E402
from heedful.errors import UnsupportedModelError  # noqa: E402
from heedful.registry import MethodInfo  # noqa: E402

PATH = TESTS / "data" / "method_outputs.json"
REGENERATE = "python tests/regenerate_method_outputs.py"

SENTENCES = ("a charming and often affecting journey", "the movie was dull and far too long")
MODELS = {"bert": ("bert", "classification"), "llama": ("llama", "causal_lm")}
"""Key in the file -> ``cached_model`` arguments."""

CHEAP = {"n_steps": 4, "n_samples": 8, "n_masks": 16, "max_steps": 5, "samples": 2}
"""Options passed to every method that takes them, so that the iterative and sampling methods
stay quick on the tiny models."""

RTOL, ATOL = 1e-4, 1e-6
"""Scores agree when ``|new - old| <= ATOL * max|old| + RTOL * |old|`` (per sentence)."""


def head_mask(model: heedful.Model) -> list[list[int]]:
    """A fixed head mask of ``model``'s shape (every other head, starting with the first), so
    Mask-LRP's golden scores do not depend on a cached mask computed from data."""
    layers, heads = model.adapter.num_layers, model.adapter.config.num_attention_heads
    return [[int((layer + head) % 2 == 0) for head in range(heads)] for layer in range(layers)]


def golden_options(info: MethodInfo, model: heedful.Model) -> dict[str, Any]:
    """The options a method runs with in the golden file."""
    found = {name: value for name, value in CHEAP.items() if info.takes(name)}
    if info.takes("head_mask"):
        found["head_mask"] = head_mask(model)
    return found


def scores(info: MethodInfo, key: str, options: Mapping[str, Any]) -> list[list[float]]:
    """The method's scores of :data:`SENTENCES` with model ``key`` of :data:`MODELS`."""
    model = cached_model(*MODELS[key])
    return [e.scores.tolist() for e in model.explain(list(SENTENCES), info.name, **options)]


def outputs(info: MethodInfo) -> dict[str, Any]:
    """The golden entry of one method: version, options and scores per model (a model the
    method declines -- ``alti_logit`` on the post-LN BERT -- has none)."""
    entry: dict[str, Any] = {"version": info.version, "options": {}, "scores": {}}
    for key, (family, task) in MODELS.items():
        if not info.supports(task):
            continue
        options = golden_options(info, cached_model(family, task))
        try:
            found = scores(info, key, options)
        except UnsupportedModelError:
            continue
        entry["options"][key] = options
        entry["scores"][key] = found
    return entry


def _moved(old: list[list[float]], new: list[list[float]]) -> float | None:
    """The largest change relative to a sentence's largest score, when beyond tolerance."""
    worst = None
    for a, b in zip(old, new, strict=True):
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if a.shape != b.shape:
            return float("inf")
        scale = float(np.nanmax(np.abs(a), initial=0.0)) or 1.0
        if not np.allclose(b, a, rtol=RTOL, atol=ATOL * scale, equal_nan=True):
            change = np.abs(b - a) / scale
            worst = max(worst or 0.0, float(np.nanmax(change)) if np.isfinite(change).any() else float("inf"))
    return worst


def differences(golden: Mapping[str, Any], infos: Mapping[str, MethodInfo]) -> list[str]:
    """What the registry ``infos`` and the ``golden`` file disagree on, one line each: methods or
    versions the file does not know (regenerate it), and methods whose outputs moved while their
    version stayed (bump it, then regenerate)."""
    found = [f"{name}: not in {PATH.name}; regenerate it ({REGENERATE})" for name in infos if name not in golden]
    found += [f"{name}: in {PATH.name} but not registered; regenerate it ({REGENERATE})" for name in golden if name not in infos]
    for name, info in infos.items():
        entry = golden.get(name)
        if entry is None:
            continue
        if entry["version"] != info.version:
            found.append(
                f"{name}: version {info.version} in the registry, {entry['version']} in {PATH.name}; "
                f"regenerate the file ({REGENERATE})"
            )
            continue
        for key, options in entry["options"].items():
            moved = _moved(entry["scores"][key], scores(info, key, options))
            if moved is not None:
                found.append(
                    f"{name}: outputs on the tiny {key} model moved ({moved:.2e} of the largest score) while its "
                    f"version stayed {info.version}: bump version= in its @register(...) and regenerate "
                    f"{PATH.name} ({REGENERATE})"
                )
    return found


def load() -> dict[str, Any]:
    return json.loads(PATH.read_text(encoding="utf-8"))["methods"]


def main() -> None:
    methods = {info.name: outputs(info) for info in heedful.methods()}
    payload = {
        "about": "Golden outputs of every registered method; see tests/regenerate_method_outputs.py.",
        "sentences": list(SENTENCES),
        "models": {key: {"family": family, "task": task} for key, (family, task) in MODELS.items()},
        "methods": methods,
    }
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {PATH} ({len(methods)} methods)")


if __name__ == "__main__":
    main()
