"""Evaluating explanations: what a dataset example becomes for a model, measuring the raw
curves, and deriving the metrics -- the pieces :func:`evaluate` (Python) and ``heedful bench``
(with its results store) are made of.

>>> import heedful
>>> from heedful.evaluate import evaluate
>>> model = heedful.load("minilm-sentiment")                                   # doctest: +SKIP
>>> data = heedful.datasets.load("movies", "test", n=50)                       # doctest: +SKIP
>>> inputs = model_inputs(data, model.adapter, "predicted")                    # doctest: +SKIP
>>> expl = model.explain([i.text for i in inputs], "normxlogit", max_length=90) # doctest: +SKIP
>>> evaluate(model, expl, ["aopc", "sufficiency"], "normxlogit", inputs)["aopc"].summary.value  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heedful.adapters import ModelAdapter
from heedful.datasets.evidence import token_evidence
from heedful.datasets.examples import Dataset, Example, Span
from heedful.engine.precision import forward_precision
from heedful.engine.targets import Target
from heedful.errors import InputError
from heedful.evaluate import context as ctx
from heedful.evaluate import perturbation as pert
from heedful.evaluate import soft
from heedful.evaluate.metrics import (
    METRICS,
    Measurements,
    Metric,
    PerExample,
    Summary,
    aggregate,
    metric_names,
)
from heedful.evaluate.protocol import Protocol, get_protocol
from heedful.explanation import Explanation


# ---------------------------------------------------------------------------- model inputs
@dataclass(frozen=True)
class ModelInput:
    """What one example becomes for one model: the text(s) to explain, the target to explain
    (``None``: the predicted class), the evidence spans in *that* text, and the gold reference
    (``gold_class``: class / token index or -1; ``gold_value``: regression value or NaN).
    Context data adds ``sources`` (character spans of ``text``, explained with
    ``sources=...``) and ``answer_source`` (index of the source holding the answer; -1
    unknown)."""

    id: str
    text: str
    text_pair: str | None
    target: Target | None
    evidence_spans: tuple[Span, ...]
    gold_class: int
    gold_value: float
    sources: tuple[tuple[int, int], ...] | None = None
    answer_source: int = -1


def gold_class_index(label: int | str | None, adapter: ModelAdapter, label_names: Sequence[str] | None) -> int:
    """The model's class index for a dataset label: by name where the names match (so the
    snippet sets' 0 / 1 map to NEGATIVE / POSITIVE whatever order a model uses), else the index."""
    if label is None or adapter.task not in ("classification",):
        return -1
    model_labels = {name.lower(): i for i, name in enumerate(adapter.labels)}
    if isinstance(label, str):
        if label.lower() not in model_labels:
            raise InputError(
                f"gold label {label!r} is not one of the model's labels",
                hint=f"the model's labels: {', '.join(adapter.labels)}",
            )
        return model_labels[label.lower()]
    if label_names is not None and 0 <= label < len(label_names):
        name = label_names[label].lower()
        if name in model_labels:
            return model_labels[name]
    return int(label) if 0 <= label < len(adapter.labels) else -1


def lm_token(adapter: ModelAdapter, word: str) -> int | None:
    """Vocabulary index of ``word`` as one token (with a leading space where the vocabulary
    marks word starts, as BPE does), or ``None`` when it is more than one token or unknown."""
    unk = getattr(adapter.tokenizer, "unk_token_id", None)
    for candidate in (" " + word, word):
        ids = adapter.tokenizer(candidate, add_special_tokens=False)["input_ids"]
        if len(ids) == 1 and ids[0] != unk:
            return int(ids[0])
    return None


def _shift(spans: Sequence[Span], at: int, delta: int) -> tuple[Span, ...]:
    return tuple((seg, s + delta if s >= at else s, e + delta if e > at else e) for seg, s, e in spans)


def model_inputs(
    data: Dataset | Sequence[Example],
    adapter: ModelAdapter,
    label: str = "predicted",
    skipped: dict | None = None,
    lm_word: str = "target",
) -> list[ModelInput]:
    """The inputs of ``data``'s examples for ``adapter``'s model; examples the model cannot take
    are left out and counted in ``skipped`` (reason -> count).

    * classification: the text (pair); target = predicted class, or the gold label when
      ``label="gold"`` (examples without one are skipped);
    * regression: the text; gold value = ``rating``;
    * masked LM: ``text`` with the target word replaced by the mask token; target = the target
      word (as one vocabulary token);
    * causal LM: the text before the target word; target = the target word as the next token
      (examples whose evidence is not in that prefix are skipped).

    ``lm_word="foil"`` explains the foil word instead of the target for language models
    (NormXLogit's LogAt(Foil)); the gold reference stays the target word.

    Context data (``task="context"``, :mod:`heedful.datasets.context`) needs a causal LM: the
    prompt is explained with its sources, the target is the example's continuation (one token
    or a span; ``None``: the predicted next token), the evidence its answer span.
    """
    if lm_word not in ("target", "foil"):
        raise InputError(f"lm_word must be 'target' or 'foil', got {lm_word!r}")
    examples = list(data)
    names = data.label_names if isinstance(data, Dataset) else None
    skipped = skipped if skipped is not None else {}
    task = adapter.task
    found: list[ModelInput] = []

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    if isinstance(data, Dataset) and data.task == "context":
        for ex in examples:
            if task != "causal_lm":
                skip("context data needs a causal language model")
                continue
            sources, answer, spans = ctx.example_sources(ex)
            target = None if ex.target is None else Target("given", ex.target)
            found.append(ModelInput(ex.id, ex.text, None, target, spans, -1, float("nan"), sources, answer))
        return found

    for ex in examples:
        gold_value = float(ex.rating) if ex.rating is not None else float("nan")
        if task in ("classification", "regression"):
            gold = gold_class_index(ex.label, adapter, names) if task == "classification" else -1
            target = None
            if label == "gold" and task == "classification":
                if gold < 0:
                    skip("no gold label")
                    continue
                target = Target("given", gold)
            found.append(ModelInput(ex.id, ex.text, ex.text_pair, target, ex.evidence_spans, gold, gold_value))
            continue
        if ex.target is None or ex.target_span is None:
            skip("no target word for a language model")
            continue
        token = lm_token(adapter, ex.target)
        explained = token if lm_word == "target" else (lm_token(adapter, ex.foil) if ex.foil else None)
        if token is None or explained is None:
            skip(f"{'target' if token is None else 'foil'} word is not one known token")
            continue
        if task == "masked_lm":
            mask = adapter.tokenizer.mask_token
            start, end = ex.target_span
            spans = _shift(ex.evidence_spans, end, len(mask) - (end - start))
            text = ex.masked(mask)
        else:
            if not ex.evidence_before_target:
                skip("evidence after the target (causal LM)")
                continue
            text, spans = ex.prefix, ex.evidence_spans
        found.append(ModelInput(ex.id, text, ex.text_pair, Target("given", explained), spans, token, gold_value))
    return found


# ---------------------------------------------------------------------------- measuring
SOURCES = ("remove", "keep", "loo", "soft", "ablations")
TOKEN_SOURCES = ("remove", "keep", "loo", "soft")
"""The measurements read off token perturbations (``ablations`` removes whole sources)."""


def measure(
    adapter: ModelAdapter,
    explanations: Sequence[Explanation],
    protocol: Protocol,
    sources: Sequence[str],
    chunk: int | None = None,
    shared: ctx.SharedAblations | None = None,
) -> Measurements:
    """Raw perturbation measurements of ``explanations`` (one batch) for the given ``sources``
    (``shared``: source-ablation outputs other runs measured, see
    :class:`~heedful.evaluate.context.SharedAblations`). Every pass runs at the protocol's
    ``precision``."""
    with forward_precision(protocol.precision):
        return _measure(adapter, explanations, protocol, sources, chunk, shared)


def _measure(
    adapter: ModelAdapter,
    explanations: Sequence[Explanation],
    protocol: Protocol,
    sources: Sequence[str],
    chunk: int | None,
    shared: ctx.SharedAblations | None,
) -> Measurements:
    m = Measurements(protocol=protocol, n=len(explanations))
    if "ablations" in sources:
        m.ablations = ctx.measure_ablations(adapter, explanations, protocol, shared, chunk)
    if not any(s in TOKEN_SOURCES for s in sources):
        m.x = protocol.curve_ratios
        return m
    prepared = pert.prepare(adapter, explanations, protocol, chunk)
    m.original, m.kept = prepared.original, prepared.kept
    if "remove" in sources:
        m.x, m.remove, m.remove_valid = pert.curve(prepared, "remove", chunk)
    if "keep" in sources:
        m.x, m.keep, m.keep_valid = pert.curve(prepared, "keep", chunk)
    if m.x is None:
        m.x = protocol.curve_ratios
    if "soft" in sources:
        m.soft_erased, m.soft_kept = soft.measure_soft(prepared)
    if "loo" in sources:
        drops, mask = pert.leave_one_out(prepared, chunk)
        scores = prepared.scores.numpy()
        m.loo_drops = [drops[b, mask[b]] for b in range(len(explanations))]
        m.loo_scores = [scores[b, mask[b]] for b in range(len(explanations))]
    return m


def considered_positions(expl: Explanation, specials: str, task: str) -> np.ndarray:
    """``[N]`` bool: positions compared with the evidence (a masked LM's target never is)."""
    special = np.asarray(expl.special, dtype=bool)
    keep = np.ones(len(expl.tokens), dtype=bool)
    if specials == "exclude":
        keep &= ~special
    elif specials == "leading":
        content = np.flatnonzero(~special)
        first = content[0] if len(content) else len(special)
        keep &= ~(special & (np.arange(len(special)) < first))
    if task == "masked_lm" and 0 <= expl.target.anchor < len(keep):
        keep[expl.target.anchor] = False
    return keep


def attach_references(
    m: Measurements, explanations: Sequence[Explanation], inputs: Sequence[ModelInput] | None, task: str
) -> Measurements:
    """Add gold references and evidence (from ``inputs``, aligned with ``explanations``), and
    what the context metrics compare (:func:`heedful.evaluate.context.attach_context`)."""
    m.scores = [np.asarray(e.scores, dtype=float) for e in explanations]
    m.considered = [considered_positions(e, m.protocol.plausibility_specials, task) for e in explanations]
    ctx.attach_context(m, explanations, None if inputs is None else [i.answer_source for i in inputs])
    if inputs is None:
        m.gold_class = np.full(m.n, -1)
        m.gold_value = np.full(m.n, np.nan)
        m.evidence = [np.zeros(len(e.tokens), dtype=bool) for e in explanations]
        return m
    if len(inputs) != len(explanations):
        raise InputError(f"{len(explanations)} explanations but {len(inputs)} inputs")
    m.gold_class = np.array([i.gold_class for i in inputs], dtype=np.int64)
    m.gold_value = np.array([i.gold_value for i in inputs], dtype=float)
    m.evidence = [token_evidence(e.offsets, e.segments, i.evidence_spans) for e, i in zip(explanations, inputs, strict=True)]
    return m


# ---------------------------------------------------------------------------- records (store)
def to_records(m: Measurements, source: str) -> list[dict]:
    """One JSON-ready dict per example holding ``source``'s raw measurements."""
    if source == "ablations":
        return ctx.ablation_records(m.ablations)
    records = []
    for b in range(m.n):
        base = {f"original_{f}": getattr(m.original, f)[b].item() for f in pert.Outputs.FIELDS}
        if source == "soft":
            base.update(soft.soft_records(m.soft_erased, m.soft_kept)[b])
        elif source == "loo":
            base["drops"] = m.loo_drops[b].tolist()
            base["scores"] = m.loo_scores[b].tolist()
        else:
            outs, valid = (m.remove, m.remove_valid) if source == "remove" else (m.keep, m.keep_valid)
            base.update({f: getattr(outs, f)[b].tolist() for f in pert.Outputs.FIELDS})
            base["valid"] = valid[b].tolist()
            base["x"] = m.x.tolist()
        base["kept"] = bool(m.kept_mask[b])
        records.append(base)
    return records


def from_records(protocol: Protocol, records: dict[str, list[dict]], n: int) -> Measurements:
    """Measurements of ``n`` examples back from ``source -> [record per example]``."""
    m = Measurements(protocol=protocol, n=n, x=protocol.curve_ratios)
    if "ablations" in records:
        m.ablations = ctx.ablations_from_records(records["ablations"])
    token_records = [records[s] for s in TOKEN_SOURCES if s in records]
    if not token_records:
        return m
    any_records = token_records[0]
    m.original = pert.Outputs(
        *(np.array([r[f"original_{f}"] for r in any_records], dtype=np.int64 if f == "predicted" else float) for f in pert.Outputs.FIELDS)
    )
    m.kept = np.array([bool(r.get("kept", True)) for r in any_records])
    for source in ("remove", "keep"):
        if source in records:
            rows = records[source]
            outs = pert.Outputs(
                *(np.array([r[f] for r in rows], dtype=np.int64 if f == "predicted" else float) for f in pert.Outputs.FIELDS)
            )
            valid = np.array([r["valid"] for r in rows], dtype=bool)
            m.x = np.asarray(rows[0]["x"], dtype=float)
            if source == "remove":
                m.remove, m.remove_valid = outs, valid
            else:
                m.keep, m.keep_valid = outs, valid
    if "soft" in records:
        m.soft_erased, m.soft_kept = soft.soft_from_records(records["soft"])
    if "loo" in records:
        m.loo_drops = [np.asarray(r["drops"], dtype=float) for r in records["loo"]]
        m.loo_scores = [np.asarray(r["scores"], dtype=float) for r in records["loo"]]
    return m


# ---------------------------------------------------------------------------- one call
@dataclass
class MetricResult:
    """One metric over a set of explanations: per-example values (and curves), the summary, and
    the curve's x values (ratios, or layers 1..L)."""

    metric: Metric
    per_example: PerExample
    summary: Summary
    x: np.ndarray | None


def sources_for(metrics: Sequence[str]) -> list[str]:
    """The raw measurement sources the metrics need, in a fixed order."""
    needed = {METRICS[name].source for name in metrics}
    return [s for s in SOURCES if s in needed]


def check_metric(metric: Metric, task: str) -> None:
    if metric.needs_value and task != "regression":
        raise InputError(f"{metric.name} is for regression models", hint="use aopc / accuracy for classifiers")
    if metric.needs_probability and task == "regression":
        raise InputError(f"{metric.name} needs class probabilities", hint="use pearson / pearson_drop for regression")
    if metric.name in ("accuracy", "accuracy_drop") and task == "regression":
        raise InputError(f"{metric.name} needs a classifier or language model", hint="use pearson for regression")


def evaluate(
    model,
    explanations: Sequence[Explanation],
    metrics: str | Sequence[str],
    protocol: str | Protocol | None = None,
    inputs: Sequence[ModelInput] | None = None,
    batch_size: int = 32,
    chunk: int | None = None,
    shared: ctx.SharedAblations | None = None,
    precision: str | None = None,
) -> dict[str, MetricResult]:
    """Faithfulness and plausibility of ``explanations`` of ``model`` (a :class:`heedful.Model`).

    ``inputs`` (from :func:`model_inputs`, aligned with ``explanations``) supply gold labels /
    values and evidence; without them accuracy is measured against the original predictions and
    plausibility metrics are undefined. Examples are measured ``batch_size`` at a time; all
    perturbed copies of a batch run together in chunks of about ``TOKEN_BUDGET`` tokens.
    Context metrics read the explanations' sources and ``inputs``' answer sources; ``shared``
    lets several calls (one per method) share the random source ablations they measure.
    ``precision`` (``"fp32"``, ``"bf16"``, ``"int8"`` or ``"auto"``; default: the protocol's)
    sets the protocol's ``precision``: the forward passes of the curves run at it
    (:mod:`heedful.engine.precision`; ``"auto"``: bf16 where this machine runs it faster, else fp32).
    """
    adapter: ModelAdapter = getattr(model, "adapter", model)
    protocol = get_protocol(protocol)
    if precision is not None and precision != protocol.precision:
        protocol = protocol.with_(precision=precision)
    protocol = protocol.resolved(adapter.device)
    names = metric_names(metrics)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}", hint="e.g. batch_size=32")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise InputError(f"chunk must be a positive integer or None, got {chunk!r}", hint="leave chunk=None for the default")
    if inputs is not None and len(inputs) != len(explanations):
        raise InputError(f"{len(explanations)} explanations but {len(inputs)} inputs", hint="pass one input per explanation, in the same order")
    for name in names:
        check_metric(METRICS[name], adapter.task)
    sources = sources_for(names)
    parts: dict[str, list[PerExample]] = {name: [] for name in names}
    x = protocol.curve_ratios
    for start in range(0, len(explanations), batch_size):
        chunk_expl = explanations[start : start + batch_size]
        chunk_inputs = None if inputs is None else inputs[start : start + batch_size]
        if sources:
            m = measure(adapter, chunk_expl, protocol, sources, chunk, shared)
            x = m.x
        else:
            m = Measurements(protocol=protocol, n=len(chunk_expl), x=x)
        attach_references(m, chunk_expl, chunk_inputs, adapter.task)
        for name in names:
            parts[name].append(METRICS[name].compute(m))
    results = {}
    for name in names:
        per = concat_per_example(parts[name])
        metric = METRICS[name]
        curve_x = x if metric.curve_kind == "ratio" else np.asarray(protocol.source_ks) if metric.curve_kind == "sources" else (
            np.arange(1, per.curves.shape[1] + 1) if per.curves is not None else None
        )
        results[name] = MetricResult(metric, per, aggregate(metric, per, protocol), curve_x)
    return results


def concat_per_example(parts: Sequence[PerExample]) -> PerExample:
    values = np.concatenate([p.values for p in parts]) if parts else np.zeros(0)
    curves = None
    if parts and all(p.curves is not None for p in parts):
        width = max(p.curves.shape[1] for p in parts)
        curves = np.concatenate(
            [np.pad(p.curves, ((0, 0), (0, width - p.curves.shape[1])), constant_values=np.nan) for p in parts]
        )
    extras = None
    if parts and all(p.extras is not None for p in parts):
        extras = [e for p in parts for e in p.extras]
    return PerExample(values, curves, extras)
