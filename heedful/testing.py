"""Conformance kit: tiny seeded models of every family, and :func:`check_method`, the checks
every registered method passes (as scikit-learn's ``check_estimator`` does for estimators).

Write a method, register it, and ask whether it behaves like a heedful method:

>>> import torch
>>> import heedful
>>> from heedful.testing import check_method
>>> @heedful.register("position", family="baseline", cost="no pass of its own")
... def position(problem, *, scale: float = 1.0) -> torch.Tensor:
...     '''Later tokens score higher: ``scale`` times each position's index ``[B, N]``.
...
...     Source: an example of heedful.testing.
...     '''
...     n = problem.batch.seq_len
...     return scale * torch.arange(n, dtype=torch.float32).expand(len(problem), n)
>>> check_method(position, families=("bert",))
['bert/classification', 'bert/regression', 'bert/masked_lm']

A method that normalises over the whole batch lets one example change another's scores:

>>> @heedful.register("batch_max", family="baseline", cost="no pass of its own")
... def batch_max(problem) -> torch.Tensor:
...     '''Token ids divided by the batch's largest id ``[B, N]``.
...
...     Source: an example of heedful.testing.
...     '''
...     ids = problem.batch.input_ids.float()
...     return ids / ids.max()
>>> check_method("batch_max", families=("bert",), tasks=("classification",)) # doctest: +ELLIPSIS
Traceback (most recent call last):
...
heedful.testing.ConformanceError: batch_max fails 1 check(s):
  bert/classification: batch_invariance: example 1 ('dull') differs in a batch from alone: position ...
>>> for name in ("position", "batch_max"):
...     heedful.registry.unregister(name)

The tiny models (:func:`tiny_hf`, :func:`tiny_model`, the table :data:`TINY_FAMILIES`; defined in
:mod:`heedful.tiny_models`) are randomly initialised, seeded, with real fast tokenizers built in
memory from :data:`CORPUS` -- nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from heedful.adapters import Forward
from heedful.attribution import get_method
from heedful.engine.batch import Batch
from heedful.engine.problem import Problem
from heedful.errors import InputError, UnsupportedModelError
from heedful.explanation import Explanation
from heedful.family_checks import check_family as _check_family
from heedful.family_checks import family_checks
from heedful.model import Model
from heedful.registry import ALL_TASKS, MethodInfo, registered
from heedful.tiny_models import (  # the tiny models, offered to users with the conformance kit
    ALL_FAMILIES,
    CORPUS,
    DECODERS,
    ENCODERS,
    INIT_RANGE,
    MODEL_FAMILIES,
    TINY_FAMILIES,
    TinyFamily,
    bytelevel_tokenizer,
    conformance_model,
    random_head_mask,
    tasks_of,
    tiny_hf,
    tiny_model,
    tokenizer_for,
    wordpiece_tokenizer,
)

__all__ = [
    "ALL_FAMILIES",
    "CHECKS",
    "CORPUS",
    "ConformanceError",
    "DECODERS",
    "ENCODERS",
    "FAST_OPTIONS",
    "Failure",
    "INIT_RANGE",
    "MASKED_TEXTS",
    "MODEL_FAMILIES",
    "SOURCES",
    "TEXTS",
    "TINY_FAMILIES",
    "TinyFamily",
    "bytelevel_tokenizer",
    "check_family",
    "check_method",
    "conformance_model",
    "fast_options",
    "parametrize_with_families",
    "random_head_mask",
    "tasks_of",
    "tiny_family_factory",
    "tiny_hf",
    "tiny_model",
    "tokenizer_for",
    "wordpiece_tokenizer",
]

FAST_OPTIONS: dict[str, Any] = {
    "n_steps": 4,  # integrated gradients' path points
    "n_samples": 8,  # SmoothGrad's noised copies, LIME's and KernelSHAP's coalitions
    "n_masks": 16,  # RISE
    # co-perturbation's / Guan et al.'s optimisation steps; at 5 co-perturbation on the tiny GPT-2
    # keeps its uniform start (no step improves it) whatever the seed, and determinism proves nothing
    "max_steps": 10,
    "samples": 2,  # noise draws per step (co-perturbation, individual perturbation)
    "head_mask": random_head_mask,  # Mask-LRP
    "beam": 2,  # solvability_beam's orderings kept per step
    "chains": 2,  # reagent's independent chains
    "heads": "uniform",  # AT2's head weights: none are learned for the tiny models (tests/test_at2.py learns some)
}
"""Options :func:`check_method` passes to every method that takes an option of that name (read
from :attr:`MethodInfo.options`), to keep expensive methods quick on the tiny models; a function
is called with the model to give the value (or, like AT2's ``heads``, a setting without which the
method declines the tiny models). Checks run on these settings, not the defaults. The
one table of fast options: the golden outputs (``tests/regenerate_method_outputs.py``) and the
invariance tests read it too; a new option that multiplies a method's work gets its entry here."""


def fast_options(info: MethodInfo, model: Model) -> dict[str, Any]:
    """The :data:`FAST_OPTIONS` that ``info`` takes, their values for ``model``."""
    return {
        name: value(model) if callable(value) else value
        for name, value in FAST_OPTIONS.items()
        if info.takes(name)
    }


# =========================================================================== conformance

TEXTS = ("a charming , unbelievably affecting journey", "dull")
"""Texts of different lengths: the second is padded in a batch with the first. The first has
enough content tokens that a stochastic method's draws matter."""

SOURCES = "tokens:2"
"""How the context methods (``needs_sources``) cut the texts into sources."""

MASKED_TEXTS = ("the plot is {mask} yet the actors are wonderful", "a {mask} film")
"""Masked-LM texts (``{mask}``: the tokenizer's mask token, the anchor)."""

RTOL, ATOL = 1e-4, 5e-5
"""Batch-invariance tolerance; ``ATOL`` is scaled by the largest score of the reference. Float32
rounding alone moves a relevance pass's scores by up to ~1.2e-5 of the largest score between
batch shapes (LRP on a masked LM: identical in float64); what leaks from padding is orders
larger."""


@dataclass(frozen=True)
class Failure:
    """One failed check of ``method`` on the tiny ``family`` model with the ``task`` head."""

    method: str
    family: str
    task: str
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.family}/{self.task}: {self.check}: {self.message}"


class ConformanceError(AssertionError):
    """Raised by :func:`check_method`; ``failures`` lists every failed check."""

    def __init__(self, method: str, failures: Sequence[Failure]) -> None:
        self.method = method
        self.failures = list(failures)
        lines = "\n".join(f"  {f}" for f in self.failures)
        super().__init__(f"{method} fails {len(self.failures)} check(s):\n{lines}")

    @property
    def checks(self) -> set[str]:
        """The names of the checks that failed."""
        return {f.check for f in self.failures}


@dataclass
class _Passes:
    """What ran inside :func:`_watched`: ``sequences`` through the model's backbone; ``edited``:
    some pass ran token ids that are not rows of the problem's own; ``replaced`` (masked LMs):
    sequences whose output was read at a position not holding the ``[MASK]`` token."""

    sequences: int = 0
    edited: bool = False
    replaced: int = 0


@dataclass
class _Run:
    """One run of a method outside :meth:`Model.explain`: the prepared problem, the raw scores,
    and the passes (problem preparation included) the adapter counted and :class:`_Passes` saw."""

    problem: Problem
    scores: Any
    forward: int
    backward: int
    passes: _Passes


def _own_rows(ids: torch.Tensor, mask: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``[R]`` bool: rows of ``ids`` / ``mask`` ``[R, W]`` that are an example of ``batch`` as
    it is (same real positions, same ids there)."""
    width = ids.shape[1]
    if width > batch.seq_len:
        return torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    own_ids, own_mask = batch.input_ids[:, :width].to(ids.device), batch.attention_mask[:, :width].to(ids.device)
    real = mask.bool()[:, None, :]
    same = ((ids[:, None, :] == own_ids[None]) | ~real) & (mask[:, None, :] == own_mask[None])
    return same.all(dim=2).any(dim=1)


@contextlib.contextmanager
def _watched(model: Model, own: Batch) -> Iterator[_Passes]:
    """Record the passes run inside the block on a problem of batch ``own`` (see :class:`_Passes`)."""
    adapter = model.adapter
    seen = _Passes()
    mask_id = model.tokenizer.mask_token_id if model.task == "masked_lm" else None
    original = adapter.forward

    def forward(batch: Batch, anchor: torch.Tensor, **kwargs: Any) -> Forward:
        ids = kwargs.get("input_ids")
        if kwargs.get("prefix") is not None:  # a copy's positions after a shared prefix
            seen.edited = True
        elif ids is not None:
            mask = kwargs.get("attention_mask")
            mask = batch.attention_mask if mask is None else mask
            seen.edited |= not bool(_own_rows(ids, mask, own).all())
        if ids is None and kwargs.get("inputs_embeds") is None:
            ids = batch.input_ids
        if ids is not None and mask_id is not None:
            read = ids[torch.arange(ids.shape[0], device=ids.device), anchor.to(ids.device)]
            seen.replaced += int((read != mask_id).sum())
        return original(batch, anchor, **kwargs)

    def count(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        first = next((kwargs[k] for k in ("input_ids", "inputs_embeds") if kwargs.get(k) is not None), None)
        first = args[0] if first is None and args else first
        seen.sequences += 0 if first is None else first.shape[0]

    hook = adapter.backbone.register_forward_pre_hook(count, with_kwargs=True)
    adapter.forward = forward
    try:
        yield seen
    finally:
        del adapter.forward  # the instance attribute; the class's method shows again
        hook.remove()


class _Case:
    """One method on one tiny model: the options it is given and the runs the checks share
    (each computed once, on first use)."""

    def __init__(self, info: MethodInfo, model: Model, family: str, given: dict[str, Any]) -> None:
        self.info, self.model, self.family, self.given = info, model, family, given
        mask = model.tokenizer.mask_token
        self.texts = [t.format(mask=mask) for t in MASKED_TEXTS] if model.task == "masked_lm" else list(TEXTS)
        # a context method ranks sources: windows of two tokens give the texts several
        self.sources = SOURCES if info.needs_sources else None

    @property
    def label(self) -> str:
        return f"{self.family}/{self.model.task}"

    def explain(self, texts: str | list[str], **options: Any) -> Any:
        return self.model.explain(texts, self.info.name, sources=self.sources, **{**self.given, **options})

    def run(self, **options: Any) -> _Run:
        """The method on the prepared problem of :attr:`texts`, as :meth:`Model.explain` runs it."""
        counter = self.model.adapter.counter
        counter.reset()
        batch = self.model.encode(self.texts)
        with _watched(self.model, batch) as passes:
            bound = self.info.bind({**self.given, **options})
            problem = self.model.prepare(batch, method=self.info.name, options=bound, sources=self.sources)
            scores = self.info.fn(problem, **bound)
        problem.release_graph()
        return _Run(problem, scores, counter.forward, counter.backward, passes)

    @functools.cached_property
    def raw(self) -> _Run:
        return self.run()

    @functools.cached_property
    def together(self) -> list[Explanation]:
        return self.explain(self.texts)

    @functools.cached_property
    def alone(self) -> list[Explanation]:
        return [self.explain(text) for text in self.texts]


def _mismatch(reference: np.ndarray, other: np.ndarray) -> str | None:
    """Where ``other`` departs most from ``reference`` beyond the batch-invariance tolerance
    (``RTOL`` x the value + ``ATOL`` x the largest score of ``reference``); ``None`` when within."""
    scale = float(np.abs(reference).max()) if reference.size else 0.0
    diff = np.abs(other - reference)
    tol = ATOL * scale + RTOL * np.abs(reference)
    bad = ~(diff <= tol)  # NaN differences count as departures
    if not bad.any():
        return None
    at = np.unravel_index(int(np.argmax(np.where(bad, diff / np.maximum(tol, 1e-30), -1.0))), diff.shape)
    where = at[-1] if len(at) == 1 else tuple(int(i) for i in at)
    return (
        f"position {where}: {other[at]:.6g} vs {reference[at]:.6g} (difference {diff[at]:.3g} > "
        f"tolerance {tol[at]:.3g}; largest score {scale:.3g})"
    )


def _check_shape(case: _Case) -> None:
    """Scores ``[B, N]`` (``[B, L, N]`` with ``layerwise=True``), finite at every real position."""
    for options in ({}, {"layerwise": True}) if case.info.layerwise else ({},):
        run = case.run(**options) if options else case.raw
        batch, scores = run.problem.batch, run.scores
        assert isinstance(scores, torch.Tensor), f"returned a {type(scores).__name__}, not a tensor"
        layers = (case.model.adapter.num_layers,) if options else ()
        expected = (len(batch), *layers, batch.seq_len)
        shown = "layerwise=True: " if options else ""
        assert tuple(scores.shape) == expected, f"{shown}scores {tuple(scores.shape)} for a batch {tuple(batch.input_ids.shape)}; expected {expected}"
        assert scores.is_floating_point(), f"{shown}scores are {scores.dtype}, not floating point"
        real = batch.attention_mask.bool().reshape(len(batch), *(1,) * len(layers), -1).to(scores.device)
        bad = int((real & ~torch.isfinite(scores)).sum())
        assert bad == 0, f"{shown}{bad} non-finite score(s) at real positions"


def _check_batch_invariance(case: _Case) -> None:
    """Each example's explanation in a padded batch equals its explanation alone."""
    for b, (text, together, alone) in enumerate(zip(case.texts, case.together, case.alone, strict=True)):
        assert together.tokens == alone.tokens, f"example {b}: tokens differ in a batch"
        assert together.scores.shape == alone.scores.shape, (
            f"example {b} ({text!r}): scores {together.scores.shape} in a batch, {alone.scores.shape} alone"
        )
        mismatch = _mismatch(alone.scores, together.scores)
        assert mismatch is None, f"example {b} ({text!r}) differs in a batch from alone: {mismatch}"


def _check_determinism(case: _Case) -> None:
    """A stochastic method: the same seed repeats the scores exactly, another seed changes them."""
    if not case.info.stochastic:
        return
    seed = case.info.bind(case.given)["seed"]
    text, first = case.texts[0], case.alone[0].scores  # the long text: its scores depend on the draws
    again = case.explain(text, seed=seed).scores
    assert np.array_equal(first, again), (
        f"seed={seed} twice: scores differ by {np.abs(first - again).max():.3g}"
    )
    other_seed = (seed or 0) + 1
    other = case.explain(text, seed=other_seed).scores
    assert _mismatch(first, other) is not None, (
        f"seed={seed} and seed={other_seed} give the same scores on {text!r} (largest difference "
        f"{np.abs(first - other).max():.3g})"
    )


def _check_special_tokens(case: _Case) -> None:
    """Tokens and ``special`` flags are the tokenizer's; a masked-LM ``[MASK]`` anchor is never
    replaced in a pass read at it, and a perturbation method that removes tokens scores it 0."""
    tokenizer = case.model.tokenizer
    for text, e in zip(case.texts, case.together, strict=True):
        encoded = tokenizer(text, return_special_tokens_mask=True)
        assert e.raw_tokens == tokenizer.convert_ids_to_tokens(encoded["input_ids"]), f"tokens of {text!r}: {e.raw_tokens}"
        expected = [bool(s) for s in encoded["special_tokens_mask"]]
        assert e.special == expected, f"special flags of {text!r}: {e.special}, the tokenizer's {expected}"
    if case.model.task != "masked_lm":
        return
    for e in case.together:
        assert e.raw_tokens[e.target.anchor] == tokenizer.mask_token, f"anchor {e.target.anchor} is {e.raw_tokens[e.target.anchor]!r}"
    passes = case.raw.passes
    assert passes.replaced == 0, f"{passes.replaced} sequence(s) run with the [MASK] anchor replaced, their output read there"
    if case.info.family == "perturbation" and passes.edited:
        at_anchor = [float(np.abs(e.scores[..., e.target.anchor]).max()) for e in case.together]
        assert max(at_anchor) == 0, f"scores at the [MASK] anchor: {at_anchor} (a removal method never removes it)"


COST_MODEL_SLACK = 2.0
"""The ``cost`` check's bound: the forward-pass equivalents a method runs per example (a backward
counts two) are at most this many times what its cost model (``passes=`` of
:func:`~heedful.register`) predicts for the examples' lengths. A cost model may overestimate -- an
early-stopping search counts every step it may take -- but never hide work: budgets, progress
estimates and the frontier's cost axis read it."""


def _check_cost(case: _Case) -> None:
    """Passes reported per example = what the adapter counted / B = what the model ran / B, and
    no more than :data:`COST_MODEL_SLACK` x the cost model's prediction."""
    from heedful.engine.workload import passes

    run, n = case.raw, len(case.texts)
    assert run.passes.sequences == run.forward, (
        f"the model ran {run.passes.sequences} sequences forward; the adapter counted {run.forward}"
    )
    for e in case.together:
        cost = e.cost
        assert cost.forward_passes >= 1, f"{cost.forward_passes} forward passes reported (the reference pass is one)"
        assert cost.seconds > 0, f"{cost.seconds} seconds reported"
        counted = (run.forward / n, run.backward / n)
        assert (cost.forward_passes, cost.backward_passes) == counted, (
            f"reported (forward, backward) {(cost.forward_passes, cost.backward_passes)} per example; counted {counted}"
        )
    if case.info.needs_sources:
        return  # its work grows with the sources, which a cost model by tokens does not see
    bound = case.info.bind(case.given)
    predicted = float(np.mean([(lambda f, b: f + 2 * b)(*passes(case.info, bound, len(e.tokens))) for e in case.together]))
    ran = (run.forward + 2 * run.backward) / n
    assert ran <= COST_MODEL_SLACK * predicted, (
        f"{ran:g} forward-pass equivalents per example run, {ran / predicted:.1f}x what the cost model predicts ({predicted:g}): "
        "give register(...) a passes= that counts them"
    )


class _Wrong:
    """A value no typed option accepts."""

    def __repr__(self) -> str:
        return "<wrong type>"


def _check_options(case: _Case) -> None:
    """Recorded options are the complete bound ones, JSON-ready, and reproduce the scores;
    an unknown option or a wrongly typed value is refused before any forward pass."""
    info = case.info
    clash = sorted(set(inspect.signature(Model.explain).parameters) & {s.name for s in info.options})
    assert not clash, (
        f"option(s) {', '.join(clash)} shadow Model.explain's own parameters: "
        "explain(..., **explanation.options) raises TypeError"
    )
    bound, recorded = info.bind(case.given), case.together[0].options
    differ = sorted(k for k in set(bound) | set(recorded) if k not in recorded or k not in bound or recorded[k] != bound[k])
    assert not differ, f"recorded options differ from the bound ones: {', '.join(f'{k}={recorded.get(k)!r}, not {bound.get(k)!r}' for k in differ)}"
    json.dumps(recorded)
    again = case.explain(case.texts, **recorded)
    for b, (e, r) in enumerate(zip(case.together, again, strict=True)):
        assert np.array_equal(e.scores, r.scores), f"example {b}: explaining again with the recorded options changes the scores"
    counter = case.model.adapter.counter
    typed = [s.name for s in info.options if (s.kinds and object not in s.kinds) or s.choices is not None]
    for bad in [{"no_such_option": 1}] + [{name: _Wrong()} for name in typed]:
        before = counter.forward
        try:
            case.explain(case.texts[1], **bad)
        except InputError:
            assert counter.forward == before, f"{bad} was refused only after {counter.forward - before} forward pass(es)"
        else:
            raise AssertionError(f"{bad} was accepted")


def _check_reads_logits(case: _Case) -> None:
    """A method that declares ``reads_logits=False`` gives the same scores with the reference
    pass's logits withheld (``[B, 0]``, as generation attribution then gives them)."""
    if case.info.reads_logits:
        return
    problem = case.raw.problem
    withheld = replace(problem, reference=replace(problem.reference, logits=problem.reference.logits[:, :0]))
    try:
        scores = case.info.fn(withheld, **case.info.bind(case.given))
    except (IndexError, RuntimeError) as exc:
        raise AssertionError(f"declares reads_logits=False, yet fails without the reference logits: {exc}") from None
    mismatch = _mismatch(case.raw.scores.detach().float().cpu().numpy(), scores.detach().float().cpu().numpy())
    assert mismatch is None, f"declares reads_logits=False, yet its scores change without the reference logits: {mismatch}"


_CHECK_FUNCTIONS: dict[str, Callable[[_Case], None]] = {
    "shape": _check_shape,
    "batch_invariance": _check_batch_invariance,
    "determinism": _check_determinism,
    "special_tokens": _check_special_tokens,
    "cost": _check_cost,
    "options": _check_options,
    "reads_logits": _check_reads_logits,
}

CHECKS: tuple[str, ...] = tuple(_CHECK_FUNCTIONS)
"""The checks of :func:`check_method`, in the order they run (see :func:`check_method`)."""


def _method_info(method: str | Callable | MethodInfo) -> MethodInfo:
    """The registered method behind a name, a registered function or a :class:`MethodInfo`."""
    if isinstance(method, str):
        return get_method(method)
    found = [i for i in registered().values() if i is method or i.fn is method]
    if not found:
        name = getattr(method, "name", getattr(method, "__name__", repr(method)))
        raise ValueError(f"{name} is not registered: decorate it with heedful.register(...) first")
    return found[0]


def check_method(
    method: str | Callable | MethodInfo,
    *,
    families: Sequence[str] = ("bert", "llama"),
    tasks: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> list[str]:
    """Check that a registered method behaves like a heedful method; raise a
    :class:`ConformanceError` (an ``AssertionError``) listing every failed check, or return the
    cases checked (``"family/task"``).

    ``method``: a registered name, the function decorated with :func:`heedful.register`, or its
    :class:`~heedful.MethodInfo`. It runs on :func:`conformance_model` of each of ``families``
    with every head among ``tasks`` (default: classification, regression, masked LM / causal LM)
    that the method supports, on :data:`TEXTS` (:data:`MASKED_TEXTS` for masked LMs), with
    :data:`FAST_OPTIONS` and then ``options`` (your method's cheap settings). A case the method
    declines with :class:`~heedful.UnsupportedModelError` (with a hint) is skipped; one that
    raises anything else fails every check it reaches. The checks (:data:`CHECKS`):

    - ``shape``: the method returns a floating tensor ``[B, N]`` for the padded batch (also
      ``[B, L, N]`` with ``layerwise=True`` for a layer-wise method, L = number of layers), finite
      at every real position, special tokens included.
    - ``batch_invariance``: each example's scores in the batch equal its scores alone (within
      :data:`RTOL` and :data:`ATOL` x the largest score): nothing leaks from padding or from the
      other example.
    - ``determinism`` (stochastic methods, those with a ``seed`` option): the same seed repeats
      the scores exactly, the next seed changes them on the longer text.
    - ``special_tokens``: tokens and ``special`` flags are the tokenizer's; on a masked LM, the
      anchor is the ``[MASK]`` token, every pass of token ids that reads its output there kept
      the ``[MASK]`` there, and a ``perturbation``-family method that removes tokens (runs token
      ids other than the problem's own) scores the anchor 0. Methods that perturb embeddings are
      not held to the last rule: the registry does not say what they leave alone.
    - ``cost``: every explanation reports at least 1 forward pass (the reference) and some
      seconds; the passes it reports per example equal what the adapter counted while the method
      ran (its problem prepared as :meth:`Model.explain` does) divided by the batch size, the
      adapter counted every sequence the model ran, and the method's cost model predicts at least
      half of them (:data:`COST_MODEL_SLACK`; context methods, whose work grows with the
      sources, are not held to this).
    - ``options``: the explanation records exactly ``info.bind(given)``, JSON-serialisable;
      explaining again with ``**explanation.options`` gives identical scores; an unknown option
      and a value of the wrong type for each typed option raise :class:`~heedful.InputError`
      before any forward pass; no option shadows a parameter of :meth:`Model.explain`.
    - ``reads_logits`` (methods that declare ``reads_logits=False``): the scores are the same
      with the reference pass's logits withheld.

    >>> check_method("saliency", families=("gpt2",), tasks=("regression",))
    ['gpt2/regression']
    """
    info = _method_info(method)
    info.bind(options)  # a bad option of the caller's is an InputError now, not a failure per case
    wanted = tuple(tasks) if tasks is not None else None
    unknown = sorted(set(wanted or ()) - set(ALL_TASKS))
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)} (one of {', '.join(ALL_TASKS)})")
    failures: list[Failure] = []
    checked: list[str] = []
    for family in families:
        for task in tasks_of(family):
            if not info.supports(task) or (wanted is not None and task not in wanted):
                continue
            model = conformance_model(family, task)
            case = _Case(info, model, family, {**fast_options(info, model), **(options or {})})
            found = _run_checks(case)
            if found is None:
                continue
            failures.extend(found)
            checked.append(case.label)
    if failures:
        raise ConformanceError(info.name, failures)
    if not checked:
        raise ValueError(f"nothing to check: {info.name} runs on none of {', '.join(families)} for tasks {wanted or 'any'}")
    return checked


def _run_checks(case: _Case) -> list[Failure] | None:
    """Every check on ``case``: its failures, or ``None`` when the method declines the model."""
    failures = []
    for name, check in _CHECK_FUNCTIONS.items():
        try:
            check(case)
        except UnsupportedModelError as exc:
            if exc.hint:
                return None
            failures.append(Failure(case.info.name, case.family, case.model.task, name, f"declined without a hint: {exc}"))
        except AssertionError as exc:
            failures.append(Failure(case.info.name, case.family, case.model.task, name, str(exc)))
        except Exception as exc:  # a check reports a crashing method; it does not stop the others
            failures.append(Failure(case.info.name, case.family, case.model.task, name, f"raised {type(exc).__name__}: {exc}"))
    return failures


# =========================================================================== families


def tiny_family_factory(family: str, **config_overrides: Any) -> Callable[[str], Model]:
    """``factory(task)`` for :func:`check_family`: the tiny model of ``family``
    (:data:`TINY_FAMILIES`) with the head for ``task``, weights drawn at :data:`INIT_RANGE`."""

    def factory(task: str) -> Model:
        return tiny_model(family, task, **{TINY_FAMILIES[family].init: INIT_RANGE, **config_overrides})

    return factory


def parametrize_with_families(families: Sequence[str] = ALL_FAMILIES):
    """A ``pytest.mark.parametrize("family_check", ...)`` over every check of :func:`check_family`
    on the tiny model of each of ``families`` (ids ``family/task/check``), as scikit-learn's
    ``parametrize_with_checks`` does::

        @parametrize_with_families()
        def test_family(family_check):
            family_check()
    """
    import pytest

    cases = [
        pytest.param(check, id=f"{family}/{name}")
        for family in families
        for name, check in family_checks(tiny_family_factory(family), _family_tasks(family), fast_options)
    ]
    return pytest.mark.parametrize("family_check", cases)


def _family_tasks(family: str) -> tuple[str, ...]:
    return ("classification", "masked_lm" if TINY_FAMILIES[family].encoder else "causal_lm")


def check_family(factory: Callable[[str], Model] | str, tasks: Sequence[str] | None = None) -> list[str]:
    """:func:`heedful.family_checks.check_family` on ``factory`` (or, given a family name, on its
    tiny model, :func:`tiny_family_factory`) for ``tasks`` (default: classification and the
    family's language-model task).

    >>> check_family("qwen3", tasks=("classification",))[:3]
    ['classification/roles', 'classification/gradient', 'classification/attention']
    """
    if isinstance(factory, str):
        tasks = _family_tasks(factory) if tasks is None else tasks
        factory = tiny_family_factory(factory)
    return _check_family(factory, tuple(tasks) if tasks is not None else ("classification", "causal_lm"), fast_options)
