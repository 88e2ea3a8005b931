"""heedful: which input tokens did a transformer rely on, and how far can that answer be trusted?

>>> import heedful
>>> model = heedful.load("minilm-sentiment")                                   # doctest: +SKIP
>>> model.explain("a charming and often affecting journey").show()             # doctest: +SKIP

``import heedful`` is light (no torch, no transformers): every name below is imported from its
module on first use (PEP 562), so that the command line starts at once and ``heedful.load``,
``heedful.Model``, ... work as ever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heedful.errors import HeedfulError, InputError, MethodError, UnsupportedModelError
from heedful.version import __version__

_LAZY: dict[str, str] = {
    "removal_drops": "heedful.engine.ablation",
    "get_method": "heedful.attribution",
    "methods": "heedful.attribution",
    "Cost": "heedful.explanation",
    "Explanation": "heedful.explanation",
    "Explanations": "heedful.explanation",
    "SourceScores": "heedful.explanation",
    "TargetInfo": "heedful.explanation",
    "WordScores": "heedful.explanation",
    "Generation": "heedful.generation",
    "GenerationExplanation": "heedful.generation_explanation",
    "from_pretrained_objects": "heedful.loading",
    "load": "heedful.loading",
    "Model": "heedful.model",
    "probe": "heedful.inside.probing",
    "Problem": "heedful.engine.problem",
    "prepare": "heedful.engine.problem",
    "MethodInfo": "heedful.registry",
    "register": "heedful.registry",
    "SourceSpec": "heedful.engine.sources",
    "QUANTITIES": "heedful.engine.targets",
    "Target": "heedful.engine.targets",
    "trace": "heedful.inside.tracing",
    "counterfactual_test": "heedful.inside.counterfactual",
    "Trace": "heedful.inside.tracing",
}
"""Public name -> the module that defines it (imported when the name is first used)."""

# Subpackages reached as attributes after ``import heedful`` (``heedful.datasets.load(...)``).
_SUBPACKAGES = frozenset({"datasets", "evaluate", "inside", "render", "testing", "zoo"})

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from heedful.attribution import get_method, methods
    from heedful.engine.ablation import removal_drops
    from heedful.engine.problem import Problem, prepare
    from heedful.engine.sources import SourceSpec
    from heedful.engine.targets import QUANTITIES, Target
    from heedful.explanation import (
        Cost,
        Explanation,
        Explanations,
        SourceScores,
        TargetInfo,
        WordScores,
    )
    from heedful.generation import Generation
    from heedful.generation_explanation import GenerationExplanation
    from heedful.inside.probing import probe
    from heedful.inside.tracing import Trace, trace
    from heedful.loading import from_pretrained_objects, load
    from heedful.model import Model
    from heedful.registry import MethodInfo, register


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        if _LAZY[name] == "heedful.registry":  # the built-in methods registered before a user's own
            importlib.import_module("heedful.attribution")
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"heedful.{name}")
    raise AttributeError(f"module 'heedful' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBPACKAGES)


__all__ = [
    "__version__",
    "Cost",
    "Explanation",
    "Explanations",
    "Generation",
    "GenerationExplanation",
    "HeedfulError",
    "InputError",
    "MethodError",
    "MethodInfo",
    "Model",
    "Problem",
    "QUANTITIES",
    "SourceScores",
    "SourceSpec",
    "Target",
    "TargetInfo",
    "Trace",
    "UnsupportedModelError",
    "WordScores",
    "from_pretrained_objects",
    "get_method",
    "load",
    "methods",
    "prepare",
    "probe",
    "register",
    "removal_drops",
    "trace",
    "counterfactual_test",
]
