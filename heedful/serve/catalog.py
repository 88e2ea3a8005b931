"""What a server offers: its models (zoo names, the ones it was started with) and every
registered method with the options a request may set, under the server's limits."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from heedful import frontier
from heedful.engine.options import OptionSpec
from heedful.errors import HeedfulError, InputError
from heedful.model import Model
from heedful.registry import MethodInfo
from heedful.serve.errors import ApiError, as_api_error
from heedful.serve.settings import ServeSettings

STEP_OPTIONS = ("n_steps", "max_steps")
"""Options whose value multiplies a method's passes by steps: capped by ``max_n_steps``."""
SAMPLE_OPTIONS = ("n_samples", "n_masks", "n_ablations", "samples")
"""Options whose value multiplies a method's passes by samples: capped by ``max_n_samples``."""
HIDDEN_OPTIONS = ("layerwise",)
"""Options the page cannot show (layer x token scores), refused like runtime options."""

ProgressStage = Callable[[str], None]


# ---------------------------------------------------------------------------- methods
def ceiling(spec: OptionSpec, settings: ServeSettings) -> int | None:
    """The server's upper limit of an option (``None``: the method's own range only)."""
    if spec.name in STEP_OPTIONS:
        return settings.max_n_steps
    if spec.name in SAMPLE_OPTIONS:
        return settings.max_n_samples
    return None


def _kind(spec: OptionSpec) -> str | None:
    """The option's JSON type as the page sees it, or ``None`` for values it cannot send (any
    object, e.g. a head mask)."""
    if spec.choices is not None:
        return "str" if all(isinstance(c, str) or c is None for c in spec.choices) else None
    for kind, label in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if kind in spec.kinds:
            return label
    return None


def offered(spec: OptionSpec) -> bool:
    """Whether a request may set the option: not a runtime option (chunk sizes stay the
    server's), not layer-wise scores, and a value JSON can carry."""
    return not spec.runtime and spec.name not in HIDDEN_OPTIONS and _kind(spec) is not None


def effective_default(spec: OptionSpec, settings: ServeSettings) -> Any:
    """The default the server runs with: the method's, lowered to the server's ceiling."""
    limit = ceiling(spec, settings)
    if limit is not None and isinstance(spec.default, int) and spec.default > limit:
        return limit
    return spec.default


def option_row(spec: OptionSpec, settings: ServeSettings) -> dict[str, Any]:
    """One option as ``GET /api/methods`` lists it."""
    low = high = None
    if spec.range is not None:
        low, high = spec.range.low, spec.range.high
    limit = ceiling(spec, settings)
    if limit is not None:
        high = limit if high is None else min(high, limit)
    return {
        "name": spec.name,
        "type": _kind(spec),
        "default": effective_default(spec, settings),
        "choices": None if spec.choices is None else list(spec.choices),
        "min": low,
        "max": high,
        "nullable": (spec.choices is not None and None in spec.choices) or type(None) in spec.kinds,
    }


def method_rows(methods: list[MethodInfo], task: str | None, settings: ServeSettings) -> list[dict[str, Any]]:
    """Every method as ``GET /api/methods`` lists it; ``supported`` for ``task`` (unknown: True);
    ``faithfulness``: its cost and AOPC on ``task``'s measured frontier (:mod:`heedful.frontier`)."""
    return [
        {
            "name": info.name,
            "family": info.family,
            "cost": info.cost,
            "summary": info.summary,
            "supported": task is None or info.supports(task),
            "options": [option_row(spec, settings) for spec in info.options if offered(spec)],
            "faithfulness": frontier.row(task, info.name),
        }
        for info in methods
    ]


def bind_methods(
    names: list[str], options: Mapping[str, Mapping[str, Any]], task: str, settings: ServeSettings
) -> list[tuple[MethodInfo, dict[str, Any]]]:
    """The request's methods with the options each runs with, validated before any work: the
    method count, unknown methods (404), methods the model's task lacks, options for a method
    not asked for or not offered, values out of the method's range or above the server's
    limits (422, the CLI's messages)."""
    from heedful.attribution import get_method
    from heedful.evaluate.bench import check_options

    if not names:
        raise ApiError(422, "no method given", "name at least one method")
    if len(names) > settings.max_methods:
        raise ApiError(
            422,
            f"{len(names)} methods, above this server's limit of {settings.max_methods}",
            f"pick at most {settings.max_methods}, or start heedful serve with --max-methods",
        )
    try:
        infos = [get_method(name) for name in names]
        seen: set[str] = set()
        for info in infos:
            if info.name in seen:
                raise InputError(f"method {info.name!r} is asked for twice", hint="name each method once")
            seen.add(info.name)
            get_method(info.name, task)  # a method the model's task lacks fails here
        given = check_options([i.name for i in infos], {k: dict(v) for k, v in options.items()})
        return [(info, _method_options(info, given.get(info.name, {}), settings)) for info in infos]
    except HeedfulError as exc:
        raise as_api_error(exc) from None


def _method_options(info: MethodInfo, given: dict[str, Any], settings: ServeSettings) -> dict[str, Any]:
    """``given`` options of ``info`` checked against what the server offers and its ceilings,
    with the ceilings as defaults where the method's default exceeds them."""
    found = dict(given)
    for name, value in given.items():
        spec = info.option(name)
        if not offered(spec):
            raise InputError(f"{info.name}: option {name} is not offered by this server", hint="the page's options are those GET /api/methods lists")
        limit = ceiling(spec, settings)
        if limit is not None and isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
            flag = "--max-n-steps" if name in STEP_OPTIONS else "--max-n-samples"
            raise InputError(f"{info.name}: {name}={value} is above this server's limit of {limit}", hint=f"use {name} <= {limit}, or start heedful serve with {flag}")
    for spec in info.options:
        if spec.name not in found and offered(spec) and effective_default(spec, settings) != spec.default:
            found[spec.name] = effective_default(spec, settings)
    info.bind(found)  # wrong types and values fail here
    return found


# ---------------------------------------------------------------------------- models
class Catalog:
    """The models a server offers and the ones it holds in memory (one copy each).

    Offered: the models it was started with, every zoo model (built on first use), and models
    handed over already loaded (``preloaded``, e.g. tests' tiny models). A request names a model
    only by one of these names, never by a path. Models are loaded only by the server's worker
    thread, so each is loaded once."""

    def __init__(self, settings: ServeSettings, preloaded: Mapping[str, Model] | None = None) -> None:
        from heedful import zoo

        self.settings = settings
        self.loaded: dict[str, Model] = dict(preloaded or {})
        self._lock = threading.Lock()
        self.names = list(dict.fromkeys([*settings.models, *self.loaded, *zoo.zoo_names()]))

    @property
    def default(self) -> str:
        return self.settings.default_model

    def check(self, name: str | None) -> str:
        """``name`` (``None``: the default model) when the server offers it; 404 otherwise."""
        name = self.default if name is None else name
        if name not in self.names:
            raise ApiError(404, f"unknown model {name!r}", f"models this server offers: {', '.join(self.names)}")
        return name

    def get(self, name: str, stage: ProgressStage | None = None) -> Model:
        """The loaded model ``name``, loading (and for a zoo model on first use, building) it."""
        from heedful import zoo

        name = self.check(name)
        with self._lock:
            if name in self.loaded:
                return self.loaded[name]
        if stage is not None:
            building = name in zoo.ENTRIES and not zoo.is_built(name)
            stage(f"building {name} (first use)" if building else f"loading {name}")
        import heedful

        model = heedful.load(name, device=self.settings.device or "cpu", dtype=self.settings.dtype, progress=False, **self.settings.hub(name))
        with self._lock:
            self.loaded[name] = model
        return model

    def task(self, name: str) -> str | None:
        """The model's task, known without loading it for zoo models."""
        from heedful import zoo

        if name in self.loaded:
            return self.loaded[name].task
        return zoo.ENTRIES[name].task if name in zoo.ENTRIES else None

    def rows(self) -> list[dict[str, Any]]:
        """Every offered model as ``GET /api/models`` lists it."""
        return [self._row(name) for name in self.names]

    def _row(self, name: str) -> dict[str, Any]:
        from heedful import zoo

        model = self.loaded.get(name)
        task = self.task(name)
        built = zoo.is_built(name) if name in zoo.ENTRIES else True
        if model is not None:
            labels = model.labels if task in ("classification", "regression") else None
        else:
            labels = _zoo_labels(name, task) if name in zoo.ENTRIES and built else None
        return {
            "name": name,
            "task": task,
            "built": built,
            "loaded": model is not None,
            "labels": labels,
            "decoder": task == "causal_lm",
            "default": name == self.default,
        }


def _zoo_labels(name: str, task: str | None) -> list[str] | None:
    """A built zoo model's output labels, read from its config without loading it."""
    from heedful import zoo

    if task == "regression":
        return ["value"]
    if task != "classification":
        return None
    try:
        config = json.loads((zoo.zoo_dir(name) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    id2label = config.get("id2label") or {}
    return [str(id2label[k]) for k in sorted(id2label, key=int)]
