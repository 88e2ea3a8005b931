"""The golden outputs that hold every method's ``version``: ``tests/data/method_outputs.json``.

For every registered method (:func:`heedful.methods`) the file holds its ``version`` and its
scores on :data:`SENTENCES` with the tests' tiny seeded BERT classifier and Llama causal LM
(``tests/conftest.py::cached_model``), under the options it records (the fast options of every
test, :data:`heedful.testing.FAST_OPTIONS`: few steps and samples for the iterative and sampling
methods, a fixed head mask for Mask-LRP).
``tests/test_method_versions.py`` recomputes them under several thread counts and batch
layouts: a method whose outputs moved beyond its family's float32 bound while its version did
not fails, and so does a version the file does not know.

The bounds are measured, not guessed: each method also runs on a float64 copy of each model,
its float32 scores under every layout of :data:`LAYOUTS` are compared with the float64 ones, and
a family's bound is :data:`SAFETY` times the largest such error of its methods (at least
:data:`FLOOR`). The file records the bounds, the rule and the processor they were measured on;
another processor's float32 rounding lands within them, a changed computation does not.

After changing what a method computes, bump ``version=`` in its ``@register(...)`` (stored
results of the old version are then never reused) and run::

    .venv/bin/python tests/regenerate_method_outputs.py --only NAME

(without ``--only``: every method, about a minute).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from conftest import cached_model  # noqa: E402  (tests/ on the path first)

import heedful  # noqa: E402
from heedful.errors import UnsupportedModelError  # noqa: E402
from heedful.loading import from_pretrained_objects  # noqa: E402
from heedful.registry import MethodInfo  # noqa: E402
from heedful.testing import fast_options  # noqa: E402

PATH = TESTS / "data" / "method_outputs.json"
REGENERATE = "python tests/regenerate_method_outputs.py"

SENTENCES = ("a charming and often affecting journey", "the movie was dull and far too long")
MODELS = {"bert": ("bert", "classification"), "llama": ("llama", "causal_lm")}
"""Key in the file -> ``cached_model`` arguments."""

SAFETY = 30.0
"""A method family's bound is ``SAFETY`` times the largest float32 error its methods showed when
the file was written (against float64, under every layout of :data:`LAYOUTS`). Two processors'
float32 results differ by at most the sum of their errors, but one processor's error is only a
sample: the first file's scores, written on an AVX-512 processor, differed from an AMD EPYC's
(AVX2) by up to 5.6 times the EPYC's largest error in the family (``context_cite`` on the BERT
model, 3.9e-05 against 7.0e-06), so 30 leaves five times that."""

FLOOR = 1e-6
"""The smallest bound, relative to a sentence's largest score (about 16 float32 ulps), for a
family whose methods are exact on the measuring machine (the random baseline)."""

DRAWS = 1e-3
"""A float32 error beyond this is not rounding: the float64 run computed something else (a
method drawing its random numbers in the model's dtype), and the file is not written."""

LAYOUTS = {
    "together, 1 thread": (1, "together"),
    "reversed, 2 threads": (2, "reversed"),
    "one at a time, 1 thread": (1, "alone"),
    "one at a time, 2 threads": (2, "alone"),
    "padded, 1 thread": (1, "padded"),
    "padded, 2 threads": (2, "padded"),
}
"""Thread counts and batch layouts the float32 error is measured over (a layout changes the
padding and so the shapes the kernels see and their summation order; so does the thread
count). ``padded`` explains the sentences beside :data:`FILLER` and drops its scores."""

FILLER = "a longer sentence that only pads the batch, so that every matrix product has another shape"

TEST_LAYOUTS = ("together, 1 thread", "reversed, 2 threads", "padded, 1 thread")
"""The layouts ``tests/test_method_versions.py`` recomputes every method under."""


def golden_options(info: MethodInfo, model: heedful.Model) -> dict[str, Any]:
    """The options a method runs with in the golden file: the fast options every test uses
    (:data:`heedful.testing.FAST_OPTIONS`: few steps and samples, a fixed head mask for Mask-LRP
    so that its scores do not depend on a mask computed from data)."""
    return fast_options(info, model)


def scores(
    info: MethodInfo,
    key: str,
    options: Mapping[str, Any],
    layout: str = "together, 1 thread",
    model: heedful.Model | None = None,
) -> list[list[float]]:
    """The method's scores of :data:`SENTENCES` with model ``key`` of :data:`MODELS` (or
    ``model``), computed under ``layout`` of :data:`LAYOUTS`, in the order of :data:`SENTENCES`."""
    model = model or cached_model(*MODELS[key])
    threads, arrangement = LAYOUTS[layout]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if arrangement == "alone":
            found = [model.explain([text], info.name, **options)[0] for text in SENTENCES]
        elif arrangement == "padded":
            found = list(model.explain([*SENTENCES, FILLER], info.name, **options))[: len(SENTENCES)]
        elif arrangement == "reversed":
            found = list(model.explain(list(SENTENCES[::-1]), info.name, **options))[::-1]
        else:
            found = list(model.explain(list(SENTENCES), info.name, **options))
    finally:
        torch.set_num_threads(before)
    return [e.scores.tolist() for e in found]


@functools.cache
def float64_model(key: str) -> heedful.Model:
    """A float64 copy of model ``key`` of :data:`MODELS` (the same weights): the reference the
    float32 error is measured against."""
    model = cached_model(*MODELS[key])
    double = copy.deepcopy(model.hf_model).double()
    return from_pretrained_objects(double, model.tokenizer, name=f"{model.name}-float64")


def relative_error(reference: list[list[float]], found: list[list[float]]) -> float:
    """The largest ``|found - reference|`` relative to each sentence's largest ``|reference|``
    (infinite where shapes or NaN positions differ)."""
    worst = 0.0
    for a, b in zip(reference, found, strict=True):
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
            return float("inf")
        scale = float(np.nanmax(np.abs(a), initial=0.0)) or 1.0
        worst = max(worst, float(np.nanmax(np.abs(b - a), initial=0.0)) / scale)
    return worst


def float32_error(info: MethodInfo, key: str, options: Mapping[str, Any]) -> float:
    """The method's largest float32 error on model ``key``: its scores under every layout of
    :data:`LAYOUTS` against its scores on the float64 copy."""
    reference = scores(info, key, options, model=float64_model(key))
    error = max(relative_error(reference, scores(info, key, options, layout)) for layout in LAYOUTS)
    if error > DRAWS:
        raise RuntimeError(
            f"{info.name}: float32 and float64 scores differ by {error:.2e} of the largest score on the tiny "
            f"{key} model -- not rounding; does it draw random numbers in the model's dtype?"
        )
    return error


def outputs(info: MethodInfo) -> dict[str, Any]:
    """The golden entry of one method: version, family, options, scores and measured float32
    error per model (a model the method declines -- ``alti_logit`` on the post-LN BERT -- has
    none)."""
    entry: dict[str, Any] = {"version": info.version, "family": info.family, "options": {}, "scores": {}, "float32_error": {}}
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
        entry["float32_error"][key] = float32_error(info, key, options)
    return entry


def family_bounds(methods: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Each method family's bound: :data:`SAFETY` times the largest float32 error of its methods
    on either model, at least :data:`FLOOR`."""
    bounds: dict[str, float] = {}
    for entry in methods.values():
        worst = max(entry["float32_error"].values(), default=0.0)
        bounds[entry["family"]] = max(bounds.get(entry["family"], FLOOR), SAFETY * worst)
    return dict(sorted(bounds.items()))


def differences(
    golden: Mapping[str, Any], infos: Mapping[str, MethodInfo], layouts: tuple[str, ...] = TEST_LAYOUTS
) -> list[str]:
    """What the registry ``infos`` and the ``golden`` file disagree on, one line each: methods or
    versions the file does not know (regenerate it), and methods whose outputs moved beyond their
    family's float32 bound under any of ``layouts`` while their version stayed (bump it, then
    regenerate)."""
    found = [f"{name}: not in {PATH.name}; regenerate it ({REGENERATE} --only {name})" for name in infos if name not in golden]
    found += [f"{name}: in {PATH.name} but not registered; regenerate it ({REGENERATE})" for name in golden if name not in infos]
    bounds = load_bounds()
    for name, info in infos.items():
        entry = golden.get(name)
        if entry is None:
            continue
        if entry["version"] != info.version or info.family not in bounds:
            found.append(
                f"{name}: version {info.version} in the registry, {entry['version']} in {PATH.name}; "
                f"regenerate the file ({REGENERATE} --only {name})"
            )
            continue
        bound = bounds[info.family]
        for key, options in entry["options"].items():
            moved = max(relative_error(entry["scores"][key], scores(info, key, options, layout)) for layout in layouts)
            if moved > bound:
                found.append(
                    f"{name}: outputs on the tiny {key} model moved ({moved:.2e} of the largest score, beyond the "
                    f"{info.family} family's float32 bound {bound:.1e}) while its version stayed {info.version}: "
                    f"bump version= in its @register(...) and regenerate {PATH.name} ({REGENERATE} --only {name})"
                )
    return found


def _file() -> dict[str, Any]:
    return json.loads(PATH.read_text(encoding="utf-8"))


def load() -> dict[str, Any]:
    """The golden entries, by method name."""
    return _file()["methods"]


def load_bounds() -> dict[str, float]:
    """The float32 bound of each method family, as the file was written with."""
    return _file()["bounds"]["families"]


def machine() -> str:
    """The processor and torch build the float32 errors were measured on."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return f"{cpu}; torch {torch.__version__}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write tests/data/method_outputs.json (see the module docstring).")
    parser.add_argument("--only", action="append", metavar="NAME", help="regenerate this method, keep the others' entries")
    args = parser.parse_args(argv)
    registry = {info.name: info for info in heedful.methods()}
    unknown = sorted(set(args.only or ()) - set(registry))
    if unknown:
        parser.error(f"not registered: {', '.join(unknown)}")
    methods = load() if args.only and PATH.is_file() else {}
    methods = {name: entry for name, entry in methods.items() if name in registry and "float32_error" in entry}
    for name in args.only or registry:
        methods[name] = outputs(registry[name])
        print(f"{name}: float32 error {max(methods[name]['float32_error'].values(), default=0.0):.2e}", flush=True)
    missing = sorted(set(registry) - set(methods))
    if missing:
        parser.error(f"no entry for {', '.join(missing)}: run without --only")
    methods = dict(sorted(methods.items()))
    bounds = family_bounds(methods)
    payload = {
        "about": "Golden outputs of every registered method; see tests/regenerate_method_outputs.py.",
        "sentences": list(SENTENCES),
        "models": {key: {"family": family, "task": task} for key, (family, task) in MODELS.items()},
        "bounds": {
            "rule": f"a family's bound is {SAFETY:g} x the largest float32 error of its methods against float64 "
            f"under {'; '.join(LAYOUTS)} (relative to a sentence's largest score), at least {FLOOR:g}",
            "measured_on": machine(),
            "families": bounds,
        },
        "methods": methods,
    }
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {PATH} ({len(methods)} methods); bounds: " + ", ".join(f"{k} {v:.1e}" for k, v in bounds.items()))


if __name__ == "__main__":
    main()
