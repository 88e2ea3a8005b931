"""One task of ``heedful bench``: a method on a chunk of examples, computed the same way by every
engine.

A :class:`Part` is everything a task needs and nothing of the store: the method and its options,
the chunk's :class:`~heedful.evaluate.evaluation.ModelInput`\\ s, which of them to explain and to
evaluate, and what the store already holds for them (explanations, raw measurements, which
metric values). :func:`compute_part` turns it into a :class:`PartResult` -- explanations as the
JSON the store keeps, raw measurements and per-example metric values -- with the model alone, so
it runs unchanged in the driver (the local engine) or in a worker process (the Ray engine,
:mod:`heedful.evaluate.ray_engine`). :func:`write_part` stores a result in one transaction, so a
task is stored whole or not at all; only the driver writes.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

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
from heedful.memory import peak_rss_mb, reset_peak_rss
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
    (source -> [(id, record)]) and ``metrics`` (metric -> [(id, value, curve, extra)]);
    ``seconds``: the whole task's wall time; ``pid``: the process that computed it."""

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


def explain_part(
    model: Model, method: str, options: dict[str, Any], inputs: list[ModelInput], batch_size: int, max_length: int | None
) -> list[Explanation]:
    """``method``'s explanations of ``inputs`` (in order): one batched call per target and
    sources (context data: per example)."""
    groups: dict[tuple, list[int]] = {}
    for k, item in enumerate(inputs):
        groups.setdefault((_target_key(item.target), item.sources), []).append(k)
    found: dict[int, Explanation] = {}
    for members in groups.values():
        items = [inputs[k] for k in members]
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
        found.update(zip(members, explained, strict=True))
    return [found[k] for k in range(len(inputs))]


def evaluate_part(
    model: Model,
    ids: list[str],
    explanations: dict[str, Explanation],
    inputs: dict[str, ModelInput],
    settings: Settings,
    stored: dict[str, dict[str, dict]],
    have: dict[str, set[str]],
    shared=None,
) -> tuple[dict[str, list[tuple[str, dict]]], dict[str, list[tuple[str, float, list[float] | None, dict | None]]]]:
    """Raw measurements and metric values of ``ids`` in batches of ``settings.batch_size``:
    sources whose records are ``stored`` (source -> id -> record) for a whole batch are read, not
    measured; only values missing from ``have`` (metric -> ids) are returned. ``shared``: a
    :class:`~heedful.evaluate.context.SharedAblations` the methods share."""
    protocol, names = settings.protocol, list(settings.metrics)
    sources = sources_for(names)
    new_records: dict[str, list[tuple[str, dict]]] = {s: [] for s in sources}
    values: dict[str, list[tuple[str, float, list[float] | None, dict | None]]] = {name: [] for name in names}
    known = {s: dict(stored.get(s, {})) for s in sources}
    for start in range(0, len(ids), settings.batch_size):
        part = ids[start : start + settings.batch_size]
        batch = [explanations[i] for i in part]
        to_measure = [s for s in sources if any(i not in known[s] for i in part)]
        records: dict[str, list[dict]] = {}
        if to_measure:
            fresh = measure(model.adapter, batch, protocol, to_measure, shared=shared)
            for s in to_measure:
                records[s] = to_records(fresh, s)
                new = [(i, r) for i, r in zip(part, records[s], strict=True) if i not in known[s]]
                new_records[s] += new
                known[s].update(new)
        for s in sources:
            if s not in records:
                records[s] = [known[s][i] for i in part]
        m = from_records(protocol, records, len(part)) if records else Measurements(protocol, len(part), x=protocol.curve_ratios)
        attach_references(m, batch, [inputs[i] for i in part], model.adapter.task)
        for name in names:
            per = METRICS[name].compute(m)
            for b, ident in enumerate(part):
                if ident in have.get(name, ()):
                    continue
                curve = None if per.curves is None else per.curves[b].tolist()
                extra = None if per.extras is None else per.extras[b]
                values[name].append((ident, float(per.values[b]), curve, extra))
    return {s: r for s, r in new_records.items() if r}, values


def _loaded(text: str) -> Explanation:
    """An explanation as the store gives it back (evaluation always reads this form, so a value
    does not depend on whether its explanation was computed in the same task)."""
    return Explanation.from_dict(json.loads(text))


def compute_part(model: Model, part: Part, settings: Settings, shared=None) -> PartResult:
    """Explain and evaluate one task (see the module docstring)."""
    began = time.perf_counter()
    by_id = {i.id: i for i in part.inputs}
    texts: dict[str, str] = dict(part.explanations)
    made: list[tuple[str, str]] = []
    forward = backward = 0.0
    explain_seconds, peak = 0.0, float("nan")
    if part.explain:
        reset_peak_rss()
        todo = [by_id[i] for i in part.explain]
        explained = explain_part(model, part.method, part.options, todo, settings.batch_size, settings.protocol.max_length)
        explain_seconds, peak = time.perf_counter() - began, peak_rss_mb()
        forward = sum(e.cost.forward_passes for e in explained)
        backward = sum(e.cost.backward_passes for e in explained)
        made = [(i.id, e.to_json()) for i, e in zip(todo, explained, strict=True)]
        texts.update(made)
    measurements: dict[str, list[tuple[str, dict]]] = {}
    metrics: dict[str, list] = {}
    if part.evaluate:
        loaded = {i: _loaded(texts[i]) for i in part.evaluate}
        measurements, metrics = evaluate_part(
            model, part.evaluate, loaded, by_id, settings, part.measurements, part.have, shared
        )
    return PartResult(
        part.index, made, explain_seconds, forward, backward, peak, measurements, metrics,
        time.perf_counter() - began, os.getpid(),
    )


def write_part(store: ResultsStore, part: Part, result: PartResult, settings: Settings) -> None:
    """Store ``result`` of ``part`` in one transaction: all of its rows, or none when the writer
    is killed on the way."""
    key, phash = part.key, settings.protocol_hash
    with store.transaction():
        if result.explanations:
            store.put_explanation_texts(key, result.explanations)
            store.add_cost(
                key, len(result.explanations), result.explain_seconds, result.forward, result.backward, result.peak_mb
            )
        for source, rows in result.measurements.items():
            store.put_measurements(key, source, phash, rows)
        for name, rows in result.metrics.items():
            if rows:
                store.put_metrics(key, name, phash, rows)
