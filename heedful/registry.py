"""The registry of attribution methods and the decorator that fills it.

A method is a function ``fn(problem, *, option=default, ...) -> scores`` registered with
:func:`register`. Everything about its options -- names, types, defaults, choices, ranges -- is
read from its signature (:mod:`heedful.engine.options`), so it is declared exactly once; the CLI,
:meth:`heedful.Model.compare`, ``heedful bench --option`` and the results-store keys all read
it from :class:`MethodInfo`. Importing :mod:`heedful.attribution` registers every built-in
method; :func:`heedful.methods` and :func:`heedful.get_method` look them up.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from heedful.adapters.needs import check_needs
from heedful.engine.options import OptionSpec, bind_options, option_specs
from heedful.engine.precision import Tolerates, resolve_precision
from heedful.engine.targets import QUANTITIES, TASKS
from heedful.errors import InputError, MethodError, did_you_mean

ALL_TASKS: tuple[str, ...] = TASKS
FAMILIES = ("vector", "gradient", "attention", "relevance", "perturbation", "context", "baseline")

RESERVED_OPTIONS = (
    "texts", "method", "target", "quantity", "text_pair", "batch_size", "truncation", "max_length", "progress",
    "sources",
)
"""Parameters of :meth:`heedful.Model.explain`: a method option of one of these names could not
be passed through it."""

Passes = Callable[[Mapping[str, Any], int], tuple[float, float]]
"""``passes(options, tokens) -> (forward, backward)``: the sequences a method sends through the
model per example of ``tokens`` positions with its bound ``options``, the reference pass
included (its cost model as numbers, read by :mod:`heedful.engine.workload`)."""

ReferencePass = Callable[..., Any]
"""``reference(adapter, batch, anchor, inputs_embeds) -> Forward``: the unperturbed pass a
method wants its problem prepared with (e.g. one that keeps its autograd graph)."""


@dataclass(frozen=True)
class ReferenceByOptions:
    """A method's reference pass that depends on its options and the model:
    ``choose(options, adapter)`` -> the :data:`ReferencePass` (``None``: the plain pass) for the
    bound ``options`` (every option given) on ``adapter``'s model -- e.g. ``hierarchical``
    keeps the autograd graph for a gradient coarse method and AT2's attention rows for AT2."""

    choose: Callable[[Mapping[str, Any], Any], ReferencePass | None]


@dataclass(frozen=True)
class MethodInfo:
    """A registered method.

    ``fn(problem, **options)`` returns scores ``[B, N]`` (or ``[B, L, N]`` with
    ``layerwise=True``) for every position of the problem's batch. ``options`` are read from
    ``fn``'s signature; :meth:`bind` completes and validates a user's options. ``needs_hidden``
    / ``needs_attentions``: the problem's reference pass should carry hidden states / attention
    probabilities (asked for up front so that no second pass is needed). ``reference``, when
    set, prepares the problem with a reference pass of the method's own (gradient methods keep
    its autograd graph and back-propagate through it instead of running the model again).
    ``version`` changes whenever the method's outputs change (a test holds it to that), so
    stored results of an older version are never reused. ``spans``: the method explains a
    span target (several positions' outputs summed, :attr:`~heedful.engine.targets.ResolvedTarget.positions`)
    in the passes it needs for one position. ``quantities``: what the method can explain of a
    target, its logit and/or its log-probability (LRP rules conserve logits only).
    ``needs_sources``: the method ranks sources of the text (:mod:`heedful.engine.sources`; sentences
    unless others were asked for) and gives each token its source's score shared evenly.
    ``needs``: what the method reads from the model (:data:`heedful.adapters.needs.NEEDS`:
    ``embeddings`` always; ``attentions`` and ``hidden_states`` with the flags above; ``blocks``,
    ``head``, ``roles``, ``rules`` as declared); a model that does not provide one of them
    (:meth:`heedful.adapters.ModelAdapter.provides`) is refused before any work
    (:meth:`require`).
    ``passes``: the sequences it sends per example (:data:`Passes`; ``None``: one forward, and
    one backward for a method with a reference pass of its own), what ``cost`` says in words.
    ``reads_logits``: the method reads the reference pass's logits (the prediction). A method
    that reads only attention probabilities or hidden states declares ``False``, and the steps of
    a generation that kept their probabilities then run no head at all
    (:func:`heedful.generation.shared_reference`); it gets ``[B, 0]`` logits, which fail any read.
    """

    name: str
    fn: Callable = field(repr=False)
    family: str
    tasks: tuple[str, ...]
    cost: str
    citation: str
    summary: str
    options: tuple[OptionSpec, ...] = field(default=(), repr=False)
    needs_hidden: bool = False
    needs_attentions: bool = False
    reference: ReferencePass | ReferenceByOptions | None = field(default=None, repr=False)
    version: int = 1
    per_dimension: Callable | None = field(default=None, repr=False)
    spans: bool = False
    quantities: tuple[str, ...] = QUANTITIES
    needs_sources: bool = False
    needs: tuple[str, ...] = ("embeddings",)
    passes: Passes | None = field(default=None, repr=False)
    reads_logits: bool = True

    # ------------------------------------------------------------------ the model
    def reference_for(self, options: Mapping[str, Any] | None, adapter: Any) -> ReferencePass | None:
        """The reference pass to prepare a problem with for this method at ``options`` (its
        defaults where ``None`` or missing) on ``adapter``'s model (see :class:`ReferenceByOptions`)."""
        if isinstance(self.reference, ReferenceByOptions):
            return self.reference.choose({**self.defaults, **(options or {})}, adapter)
        return self.reference

    def missing(self, adapter: Any) -> tuple[str, ...]:
        """The needs of this method that ``adapter``'s model does not provide (empty: it runs)."""
        return tuple(n for n in self.needs if not adapter.provides(n))

    def require(self, adapter: Any) -> None:
        """Refuse (one line naming what is missing, :meth:`heedful.adapters.ModelAdapter.refusal`)
        before any work when ``adapter``'s model lacks something this method needs."""
        gone = self.missing(adapter)
        if gone:
            raise adapter.refusal(self.name, gone)

    # ------------------------------------------------------------------ options
    @property
    def defaults(self) -> dict[str, Any]:
        """Every option at its default, in signature order."""
        return {spec.name: spec.default for spec in self.options}

    @property
    def stochastic(self) -> bool:
        """The method draws random numbers; its ``seed`` option fixes them."""
        return any(spec.name == "seed" for spec in self.options)

    @property
    def layerwise(self) -> bool:
        """The method can give ``[L, N]`` scores (layers 1..L) with ``layerwise=True``."""
        return any(spec.name == "layerwise" for spec in self.options)

    def quantity(self, asked: str | None, default: str = "logit") -> str:
        """The quantity this method explains: ``asked`` when it can (an :class:`InputError`
        otherwise), else ``default`` when it can, else the one it can."""
        if asked is None:
            return default if default in self.quantities else self.quantities[0]
        if asked not in QUANTITIES:
            raise InputError(f"quantity must be one of {', '.join(QUANTITIES)}, got {asked!r}", hint="use 'logit' or 'log_prob'")
        if asked not in self.quantities:
            raise InputError(
                f"{self.name} explains a target's {' or '.join(self.quantities)}, not its {asked}",
                hint=f"pass quantity={self.quantities[0]!r}",
            )
        return asked

    def takes(self, option: str) -> bool:
        return any(spec.name == option for spec in self.options)

    def option(self, name: str) -> OptionSpec:
        for spec in self.options:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def bind(self, options: Mapping[str, Any] | None = None, device: Any = None) -> dict[str, Any]:
        """The complete options of a run: ``options`` validated (unknown name, wrong type,
        value outside the choices or range -> :class:`~heedful.InputError`, before any work),
        every other option at its default. With ``device`` (the model's: the run is about to
        happen) the ``precision`` option is resolved for it (:meth:`resolve`).

        >>> import heedful
        >>> heedful.get_method("integrated_gradients").bind({"n_steps": 20})["n_steps"]
        20
        """
        given = options or {}
        if "precision" in given and not self.takes("precision"):
            raise InputError(
                f"{self.name} has no precision option (precision={given['precision']!r}): lower precision serves forward-only methods",
                hint="drop precision (only forward-only methods take it: "
                + ", ".join(sorted(n for n, i in _REGISTRY.items() if i.takes("precision")))
                + ")",
            )
        bound = bind_options(self.name, self.options, given)
        return bound if device is None else self.resolve(bound, device)

    def resolve(self, options: Mapping[str, Any], device: Any) -> dict[str, Any]:
        """``options`` with their ``precision`` (when given and the method takes one) resolved
        for ``device`` (:func:`heedful.engine.precision.resolve_precision`): ``"auto"`` becomes the
        fastest precision this method tolerates that the machine runs faster than fp32, and an
        explicit lower precision the machine runs slower warns (or, strict, is refused)."""
        found = dict(options)
        if "precision" in found and self.takes("precision"):
            tolerates = self.option("precision").extra(Tolerates) or Tolerates()
            found["precision"] = resolve_precision(found["precision"], device, tolerates.precisions)
        return found

    def key_options(self, bound: Mapping[str, Any]) -> dict[str, Any]:
        """The options that decide the result (runtime options such as chunk sizes left out, and
        options marked ``KEYED_WHEN_SET`` left out while at their defaults)."""
        runtime = {spec.name for spec in self.options if spec.runtime}
        unset = {spec.name for spec in self.options if spec.keyed_when_set and spec.name in bound and bound[spec.name] == spec.default}
        return {k: v for k, v in bound.items() if k not in runtime and k not in unset}

    # ------------------------------------------------------------------ calling
    def __call__(self, problem: Any, **options: Any) -> Any:
        """Run the method on a prepared problem with validated options (its precision resolved
        for the problem's device; refused first when the problem's model lacks something the
        method needs, :meth:`require`)."""
        bound = self.bind(options, problem.adapter.device)
        self.require(problem.adapter)
        return self.fn(problem, **bound)

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
    citation: str | None = None,
    summary: str | None = None,
    tasks: tuple[str, ...] = ALL_TASKS,
    needs_hidden: bool = False,
    needs_attentions: bool = False,
    reference: ReferencePass | ReferenceByOptions | None = None,
    version: int = 1,
    per_dimension: Callable | None = None,
    spans: bool = False,
    quantities: tuple[str, ...] = QUANTITIES,
    needs_sources: bool = False,
    needs: tuple[str, ...] = (),
    passes: Passes | None = None,
    reads_logits: bool = True,
) -> Callable[[Callable], Callable]:
    """Register ``fn`` under ``name`` (see :class:`MethodInfo`); ``fn`` is returned unchanged.

    ``fn``'s first parameter is the :class:`~heedful.Problem`; every further parameter is an
    option with a type hint and a default. ``summary`` and ``citation`` default to the first
    line of ``fn``'s docstring and its paragraph that starts with ``Source:``.
    ``per_dimension(problem, embeds, options) -> [B, N, E]`` (gradient methods): the method's
    attributions per embedding dimension at word embeddings ``embeds``, which lets wrappers
    such as SmoothGrad's noise tunnel compose with it. ``needs``: what the method reads from
    the model beyond the input embeddings and a forward pass (:data:`heedful.adapters.needs.NEEDS`; ``needs_hidden``
    and ``needs_attentions`` add ``hidden_states`` and ``attentions``).
    """

    def deco(fn: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"method {name!r} registered twice")
        if family not in FAMILIES:
            raise ValueError(f"method {name!r}: unknown family {family!r} (one of {', '.join(FAMILIES)})")
        first = next(iter(inspect.signature(fn).parameters), None)
        if first != "problem":
            raise TypeError(f"method {name!r}: the first parameter must be `problem`, not {first!r}")
        options = option_specs(fn)
        clash = [spec.name for spec in options if spec.name in RESERVED_OPTIONS]
        if clash:
            raise TypeError(f"method {name!r}: option(s) {', '.join(clash)} would clash with Model.explain's parameters")
        declared = ("embeddings", *needs, *(("hidden_states",) if needs_hidden else ()), *(("attentions",) if needs_attentions else ()))
        doc_summary, doc_citation = _described(fn)
        if not (summary or doc_summary) or not (citation or doc_citation):
            raise TypeError(
                f"method {name!r}: give a summary (the docstring's first line) and a citation "
                "(a docstring paragraph starting with 'Source:')"
            )
        _REGISTRY[name] = MethodInfo(
            name=name,
            fn=fn,
            family=family,
            tasks=tasks,
            cost=cost,
            citation=citation or doc_citation,
            summary=summary or doc_summary,
            options=options,
            needs_hidden=needs_hidden,
            needs_attentions=needs_attentions,
            reference=reference,
            version=version,
            per_dimension=per_dimension,
            spans=spans,
            quantities=quantities,
            needs_sources=needs_sources,
            needs=check_needs(declared, f"method {name!r}"),
            passes=passes,
            reads_logits=reads_logits,
        )
        return fn

    return deco


def _described(fn: Callable) -> tuple[str, str]:
    """The summary (first line) and citation (the paragraph starting ``Source:``) of ``fn``'s
    docstring; empty strings where absent."""
    doc = inspect.getdoc(fn) or ""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    summary = paragraphs[0] if paragraphs and paragraphs[0] else ""
    citation = next((p.removeprefix("Source:").strip() for p in paragraphs if p.startswith("Source:")), "")
    return summary, citation


def unregister(name: str) -> None:
    """Remove a method (for tests and for replacing a user's own method)."""
    _REGISTRY.pop(name, None)


def registered() -> dict[str, MethodInfo]:
    """The methods registered so far (import :mod:`heedful.attribution` for the built-in ones)."""
    return dict(_REGISTRY)


def find(name: str, task: str | None = None) -> MethodInfo:
    """The registered method called ``name``; a :class:`MethodError` naming the others."""
    info = _REGISTRY.get(name) or _REGISTRY.get(name.replace("-", "_").lower())
    if info is None:
        raise MethodError(
            f"unknown method {name!r}",
            hint=did_you_mean(name, sorted(_REGISTRY), "method", listing="available methods: " + ", ".join(sorted(_REGISTRY))),
        )
    if task is not None and not info.supports(task):
        raise MethodError(
            f"method {info.name!r} does not support {task} models",
            hint=f"{info.name} supports: {', '.join(info.tasks)}",
        )
    return info
