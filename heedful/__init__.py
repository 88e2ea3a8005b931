"""heedful: which input tokens did a transformer rely on, and how far can that answer be trusted?

>>> import heedful
>>> model = heedful.load("minilm-sentiment")                                   # doctest: +SKIP
>>> model.explain("a charming and often affecting journey").show()             # doctest: +SKIP
"""

from heedful.attribution import get_method, methods
from heedful.errors import HeedfulError, InputError, MethodError, UnsupportedModelError
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
from heedful.loading import from_pretrained_objects, load
from heedful.model import Model
from heedful.problem import Problem, prepare
from heedful.registry import MethodInfo, register
from heedful.sources import SourceSpec
from heedful.targets import QUANTITIES, Target
from heedful.version import __version__

# Subpackages reached as attributes after ``import heedful`` (``heedful.datasets.load(...)``),
# imported on first use so that ``import heedful`` stays light.
_SUBPACKAGES = frozenset({"datasets", "evaluate", "render", "testing", "zoo"})


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"heedful.{name}")
    raise AttributeError(f"module 'heedful' has no attribute {name!r}")


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
    "UnsupportedModelError",
    "WordScores",
    "from_pretrained_objects",
    "get_method",
    "load",
    "methods",
    "prepare",
    "register",
]
