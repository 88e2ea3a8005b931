"""The one list of attribution methods (``heedful.methods()``) and the decorator that fills it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from heedful.errors import MethodError
from heedful.targets import TASKS

ALL_TASKS: tuple[str, ...] = TASKS
FAMILY_ORDER = ("vector", "gradient", "attention", "relevance", "perturbation", "baseline")


@dataclass(frozen=True)
class MethodInfo:
    """A registered method.

    ``fn(adapter, batch, target, reference, **options)`` returns scores ``[B, N]`` (or
    ``[B, L, N]`` when ``layerwise``) for every position; ``reference`` is an unperturbed
    :class:`~heedful.adapters.Forward` carrying hidden states / attentions when the method
    declares ``needs_hidden`` / ``needs_attentions``. ``cost`` gives passes per example.
    ``choices`` maps an option to the values it accepts; other values fail before any work.
    ``reference_pass(adapter, batch, anchor) -> Forward``, when set, replaces that no-grad pass:
    single-pass gradient methods take a reference that keeps its autograd graph and
    back-propagate through it rather than run the model a second time.
    """

    name: str
    fn: Callable = field(repr=False)
    family: str
    tasks: tuple[str, ...]
    cost: str
    citation: str
    summary: str
    needs_hidden: bool = False
    needs_attentions: bool = False
    stochastic: bool = False
    layerwise: bool = False
    defaults: dict = field(default_factory=dict)
    reference_pass: Callable | None = field(default=None, repr=False)
    choices: dict = field(default_factory=dict)

    def supports(self, task: str) -> bool:
        return task in self.tasks

    def as_row(self) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "tasks": ", ".join(self.tasks),
            "cost": self.cost,
            "citation": self.citation,
            "summary": self.summary,
        }


_REGISTRY: dict[str, MethodInfo] = {}


def register(
    name: str,
    *,
    family: str,
    cost: str,
    citation: str,
    summary: str,
    tasks: tuple[str, ...] = ALL_TASKS,
    needs_hidden: bool = False,
    needs_attentions: bool = False,
    stochastic: bool = False,
    layerwise: bool = False,
    defaults: dict | None = None,
    reference_pass: Callable | None = None,
    choices: dict | None = None,
) -> Callable[[Callable], Callable]:
    """Register ``fn`` under ``name`` (see :class:`MethodInfo` for the calling convention)."""

    def deco(fn: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"method {name!r} registered twice")
        _REGISTRY[name] = MethodInfo(
            name=name,
            fn=fn,
            family=family,
            tasks=tasks,
            cost=cost,
            citation=citation,
            summary=summary,
            needs_hidden=needs_hidden,
            needs_attentions=needs_attentions,
            stochastic=stochastic,
            layerwise=layerwise,
            defaults=defaults or {},
            reference_pass=reference_pass,
            choices=choices or {},
        )
        return fn

    return deco


def _load_all() -> None:
    import heedful.attribution  # noqa: F401  (registers every method)


def methods(family: str | None = None, task: str | None = None) -> list[MethodInfo]:
    """Every registered method, optionally filtered by family or supported task.

    >>> import heedful
    >>> "normxlogit" in [m.name for m in heedful.methods()]
    True
    """
    _load_all()
    order = {f: i for i, f in enumerate(FAMILY_ORDER)}
    found = sorted(_REGISTRY.values(), key=lambda m: (order.get(m.family, len(order)), m.name))
    return [m for m in found if (family is None or m.family == family) and (task is None or task in m.tasks)]


def get_method(name: str, task: str | None = None) -> MethodInfo:
    """The method called ``name``; raises :class:`MethodError` naming the available ones."""
    _load_all()
    info = _REGISTRY.get(name) or _REGISTRY.get(name.replace("-", "_").lower())
    if info is None:
        raise MethodError(
            f"unknown method {name!r}",
            hint="available methods: " + ", ".join(sorted(_REGISTRY)),
        )
    if task is not None and not info.supports(task):
        raise MethodError(
            f"method {info.name!r} does not support {task} models",
            hint=f"{info.name} supports: {', '.join(info.tasks)}",
        )
    return info
