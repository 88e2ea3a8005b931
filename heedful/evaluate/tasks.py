"""One task of ``heedful bench``: a method on a chunk of examples, computed the same way by every
engine.

A :class:`Part` is everything a task needs and nothing of the store: the method and its options,
the chunk's :class:`~heedful.evaluate.evaluation.ModelInput`\\ s, which of them to explain and to
evaluate, and what the store already holds for them (explanations, raw measurements, which
metric values). :func:`compute_steps` turns it into :class:`PartResult`\\ s -- explanations as the
JSON the store keeps, raw measurements and per-example metric values -- one per step: each model
batch explained, then each model batch evaluated, in the batches one call on the whole chunk
makes (so an example has the same neighbours however the task is stored). It needs the model
alone, so it runs unchanged in the driver (the local engine, which stores every step as it comes:
an interrupt loses at most the step in flight) or in a worker process (the Ray engine,
:mod:`heedful.evaluate.ray_engine`, which sends the whole task back: :func:`compute_part`).
:func:`write_part` stores a result in one transaction, so a step (or a task) is stored whole or
not at all; only the driver writes.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from heedful.engine.memory import peak_rss_mb, reset_peak_rss
from heedful.evaluate.evaluation import (
    ModelInput,
    attach_references,
    from_records,
    measure,
    sources_for,
    to_records,
)
from heedful.evaluate.metrics import METRICS, Measurements
from heedful.evaluate.protocol import Protocol
from heedful.evaluate.store import ResultsStore, RunKey
from heedful.explanation import Explanation
from heedful.model import Model


@dataclass(frozen=True)
class Settings:
    """What every task of one bench shares: the protocol, the metrics, examples per model
    batch."""

    protocol: Protocol
    metrics: tuple[str, ...]
    batch_size: int

    @property
    def protocol_hash(self) -> str:
        return self.protocol.hash()


@dataclass
class Part:
    """Task ``index``: ``method`` with ``options`` (the run ``key``) on ``inputs`` (the chunk, in
    dataset order). ``explain``: ids to explain; ``evaluate``: ids lacking some metric value;
    ``explanations``: stored explanation JSON of evaluated ids not explained here;
    ``measurements``: stored raw records (source -> id -> record); ``have``: metric -> ids whose
    value is stored."""

    index: int
    key: RunKey
    method: str
    options: dict[str, Any]
    inputs: list[ModelInput]
    explain: list[str]
    evaluate: list[str]
    explanations: dict[str, str] = field(default_factory=dict)
    measurements: dict[str, dict[str, dict]] = field(default_factory=dict)
    have: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class PartResult:
    """What task ``index`` computed: ``explanations`` (id, JSON) with the wall ``explain_seconds``,
    forward / backward passes and peak memory of explaining them; new raw ``measurements``
    (source -> [(id, record)]) and ``metrics`` (metric -> [(id, value, curve, extra)]) of the
    ``evaluated`` ids; ``seconds``: the wall time of the step (or task); ``pid``: the process
    that computed it."""

    index: int
    explanations: list[tuple[str, str]]
    explain_seconds: float
    forward: float
    backward: float
    peak_mb: float
    measurements: dict[str, list[tuple[str, dict]]]
    metrics: dict[str, list[tuple[str, float, list[float] | None, dict | None]]]
    seconds: float
    pid: int
    evaluated: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Rows this result adds to the store."""
        return (
            len(self.explanations)
            + sum(len(r) for r in self.measurements.values())
            + sum(len(r) for r in self.metrics.values())
        )


def _target_key(target) -> str:
    return "predicted" if target is None else repr(target)


def explain_batches(
    model: Model, method: str, options: dict[str, Any], inputs: list[ModelInput], batch_size: int, max_length: int | None
) -> Iterator[tuple[list[int], list[Explanation]]]:
    """``method``'s explanations of ``inputs``, one model batch at a time: ``(positions in
    inputs, explanations)``. Inputs of one target and sources (context data: per example) are
    batched together, ``batch_size`` consecutive ones per call -- the batches of one
    :meth:`heedful.Model.explain` call on all of them."""
    groups: dict[tuple, list[int]] = {}
    for k, item in enumerate(inputs):
        groups.setdefault((_target_key(item.target), item.sources), []).append(k)
    for members in groups.values():
        for start in range(0, len(members), batch_size):
            batch = members[start : start + batch_size]
            items = [inputs[k] for k in batch]
            pairs = [i.text_pair for i in items]
            explained = model.explain(
                [i.text for i in items],
                method,
                items[0].target,
                text_pair=pairs if any(p is not None for p in pairs) else None,
                batch_size=batch_size,
                max_length=max_length,
                sources=None if items[0].sources is None else list(items[0].sources),
                **options,
            )
            yield batch, list(explained)


def evaluate_batches(
    model: Model,
    ids: list[str],
    explanations: dict[str, Explanation],
    inputs: dict[str, ModelInput],
    settings: Settings,
    stored: dict[str, dict[str, dict]],
    have: dict[str, set[str]],
    shared=None,
) -> Iterator[tuple[list[str], dict[str, list[tuple[str, dict]]], dict[str, list[tuple[str, float, list[float] | None, dict | None]]]]]:
    """Raw measurements and metric values of ``ids``, one batch of ``settings.batch_size`` at a
    time: ``(the batch's ids, new records, values)``. Sources whose records are ``stored``
    (source -> id -> record) for a whole batch are read, not measured; only values missing from
    ``have`` (metric -> ids) are returned. ``shared``: a
    :class:`~heedful.evaluate.context.SharedAblations` the methods share."""
    protocol, names = settings.protocol, list(settings.metrics)
    sources = sources_for(names)
    known = {s: dict(stored.get(s, {})) for s in sources}
    for start in range(0, len(ids), settings.batch_size):
        part = ids[start : start + settings.batch_size]
        batch = [explanations[i] for i in part]
        to_measure = [s for s in sources if any(i not in known[s] for i in part)]
        records: dict[str, list[dict]] = {}
        new_records: dict[str, list[tuple[str, dict]]] = {}
        if to_measure:
            fresh = measure(model.adapter, batch, protocol, to_measure, shared=shared)
            for s in to_measure:
                records[s] = to_records(fresh, s)
                new = [(i, r) for i, r in zip(part, records[s], strict=True) if i not in known[s]]
                if new:
                    new_records[s] = new
                known[s].update(new)
        for s in sources:
            if s not in records:
                records[s] = [known[s][i] for i in part]
        m = from_records(protocol, records, len(part)) if records else Measurements(protocol, len(part), x=protocol.curve_ratios)
        attach_references(m, batch, [inputs[i] for i in part], model.adapter.task)
        values: dict[str, list[tuple[str, float, list[float] | None, dict | None]]] = {name: [] for name in names}
        for name in names:
            per = METRICS[name].compute(m)
            for b, ident in enumerate(part):
                if ident in have.get(name, ()):
                    continue
                curve = None if per.curves is None else per.curves[b].tolist()
                extra = None if per.extras is None else per.extras[b]
                values[name].append((ident, float(per.values[b]), curve, extra))
        yield part, new_records, values


def _loaded(text: str) -> Explanation:
    """An explanation as the store gives it back (evaluation always reads this form, so a value
    does not depend on whether its explanation was computed in the same task)."""
    return Explanation.from_dict(json.loads(text))


def compute_steps(
    model: Model, part: Part, settings: Settings, shared=None, stored_texts: Callable[[list[str]], dict[str, str]] | None = None
) -> Iterator[PartResult]:
    """Explain and evaluate one task step by step (see the module docstring): a result per model
    batch explained, then per model batch evaluated. ``stored_texts``: the explanations of ids as
    the store holds them, read before evaluating when the caller stores each step (another writer
    of the store may have stored an example first: its values are computed from the stored one)."""
    by_id = {i.id: i for i in part.inputs}
    texts: dict[str, str] = dict(part.explanations)
    if part.explain:
        todo = [by_id[i] for i in part.explain]
        batches = explain_batches(model, part.method, part.options, todo, settings.batch_size, settings.protocol.max_length)
        reset_peak_rss()  # once per task (it collects garbage, which takes a while): the peak of the task so far
        while True:
            began = time.perf_counter()
            found = next(batches, None)
            if found is None:
                break
            seconds, peak = time.perf_counter() - began, peak_rss_mb()
            positions, explained = found
            made = [(todo[k].id, e.to_json()) for k, e in zip(positions, explained, strict=True)]
            texts.update(made)
            forward = sum(e.cost.forward_passes for e in explained)
            backward = sum(e.cost.backward_passes for e in explained)
            yield PartResult(part.index, made, seconds, forward, backward, peak, {}, {}, seconds, os.getpid())
    if part.evaluate:
        if stored_texts is not None:
            texts.update(stored_texts(part.evaluate))
        loaded = {i: _loaded(texts[i]) for i in part.evaluate}
        steps = evaluate_batches(model, part.evaluate, loaded, by_id, settings, part.measurements, part.have, shared)
        while True:
            began = time.perf_counter()
            found = next(steps, None)
            if found is None:
                break
            ids, measurements, metrics = found
            seconds = time.perf_counter() - began
            yield PartResult(part.index, [], 0.0, 0.0, 0.0, math.nan, measurements, metrics, seconds, os.getpid(), list(ids))


def compute_part(model: Model, part: Part, settings: Settings, shared=None) -> PartResult:
    """Explain and evaluate one task (see the module docstring): its steps in one result."""
    whole = PartResult(part.index, [], 0.0, 0.0, 0.0, math.nan, {}, {}, 0.0, os.getpid())
    for step in compute_steps(model, part, settings, shared):
        whole.explanations += step.explanations
        whole.explain_seconds += step.explain_seconds
        whole.forward += step.forward
        whole.backward += step.backward
        whole.peak_mb = max(whole.peak_mb, step.peak_mb) if not math.isnan(whole.peak_mb) else step.peak_mb
        for source, rows in step.measurements.items():
            whole.measurements.setdefault(source, []).extend(rows)
        for name, rows in step.metrics.items():
            whole.metrics.setdefault(name, []).extend(rows)
        whole.evaluated += step.evaluated
        whole.seconds += step.seconds
    return whole


def write_part(store: ResultsStore, part: Part, result: PartResult, settings: Settings) -> None:
    """Store ``result`` of ``part`` in one transaction: all of its rows, or none when the writer
    is killed on the way. Rows another writer stored first are kept, and so is the cost record of
    their explanations."""
    key, phash = part.key, settings.protocol_hash
    with store.transaction():
        if result.explanations:
            added = store.put_explanation_texts(key, result.explanations)
            store.add_cost(
                key, len(result.explanations), result.explain_seconds, result.forward, result.backward, result.peak_mb, added
            )
        for source, rows in result.measurements.items():
            store.put_measurements(key, source, phash, rows)
        for name, rows in result.metrics.items():
            if rows:
                store.put_metrics(key, name, phash, rows)
