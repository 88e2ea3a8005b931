"""Context attribution metrics: does an explanation point at the source the model read?

Any explanation with sources (``explain(..., sources=...)``; every example of context data,
:mod:`heedful.datasets.context`) is pooled per source with
:meth:`~heedful.Explanation.source_scores` (the sum over each source's tokens: a context
method's source score exactly, a token method's summed), whatever method produced it, and
measured five ways:

=========================  ====  ==================================================================
metric                     best  definition (source)
=========================  ====  ==================================================================
source_top1, source_top3   high  the answer source is among the ``k`` highest-scored sources (a
                                 source tied with it counts as above it, so constant scores never
                                 hit); top-k source accuracy against the planted source
precision_at_k             high  of the ``protocol.precision_k`` (20) highest-scored non-special
                                 prompt tokens, the fraction inside the answer's character span
                                 (Song et al. 2024, Mask-LRP, §4 "precision@20" on SQuAD)
source_comprehensiveness   high  ``log p(y | x) - log p(y | x without the top-k sources)`` for k in
                                 ``protocol.source_ks`` (1, 3, 5), removed together; the mean over
                                 k (Cohen-Wang et al. 2024, ContextCite §5 top-k removal; ERASER)
lds                        high  Spearman correlation, over ``protocol.lds_ablations`` random
                                 ablations keeping each source with probability
                                 ``protocol.lds_keep`` (0.5), between the sum of the kept sources'
                                 scores and the target's log-probability (ContextCite §5, linear
                                 datamodeling score)
=========================  ====  ==================================================================

``y`` is the explained target (a token, or a span's summed log-probability); sources are removed
by the protocol's removal (``auto``: deleted, for a causal LM). The ablations run as perturbed
copies through :class:`heedful.engine.runner.Runner` (:func:`measure_ablations`): one unperturbed row,
one row per k and one per random mask for each example, in length chunks. The random masks depend
only on the example (a generator seeded from its text), so every method is scored on the same
ablations; a :class:`SharedAblations` lets the methods of one bench run share their outputs. Each
metric is aggregated as its mean over examples with a 95 % percentile bootstrap interval
(:func:`heedful.evaluate.generation.bootstrap_mean`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from heedful.adapters import ModelAdapter
from heedful.datasets.context import ANSWER_SOURCE, CONTEXT, SOURCES
from heedful.datasets.examples import Example, Span
from heedful.engine.batch import Batch
from heedful.engine.perturb import never_empty, remove_tokens
from heedful.engine.runner import Copies, Runner
from heedful.engine.seeding import example_generators
from heedful.engine.sources import SourceSpec, split_text, token_sources
from heedful.engine.targets import ResolvedTarget
from heedful.errors import HeedfulError, InputError
from heedful.evaluate.intervals import bootstrap_mean
from heedful.evaluate.metrics import Measurements, PerExample, Summary, register_metric
from heedful.evaluate.perturbation import replacement_for
from heedful.evaluate.protocol import Protocol
from heedful.explanation import Explanation

CharSpan = tuple[int, int]


# ---------------------------------------------------------------------------- examples
def example_sources(example: Example) -> tuple[tuple[CharSpan, ...], int, tuple[Span, ...]]:
    """A context example's sources (character spans of its ``text``: the given ones, or the
    sentences of its context region), the index of its answer source (-1: unknown) and its
    evidence spans (the answer span; the answer source's span when only the index is given).

    The answer source is ``meta["answer_source"]`` (an :class:`InputError` when the context has
    fewer sources), else the source that overlaps the answer span most (the earlier of a tie).
    """
    meta = example.meta or {}
    if meta.get(SOURCES) is not None:
        sources = tuple((int(s), int(e)) for s, e in meta[SOURCES])
        bad = [s for s in sources if not 0 <= s[0] < s[1] <= len(example.text)]
        if bad:
            raise InputError(f"example {example.id}: source {list(bad[0])} is outside its text ({len(example.text)} characters)")
    else:
        start, end = meta.get(CONTEXT) or (0, len(example.text))
        sources = tuple(split_text(example.text, SourceSpec("sentences", within=(int(start), int(end)))))
    if not sources:
        raise InputError(f"example {example.id} has no source", hint="its context needs at least one sentence")
    evidence = tuple(example.evidence_spans)
    answer = meta.get(ANSWER_SOURCE)
    if answer is not None:
        answer = int(answer)
        if not 0 <= answer < len(sources):
            raise InputError(
                f"example {example.id}: answer_source {answer} but its context has {len(sources)} sentences",
                hint=f"give an index from 0 to {len(sources) - 1}",
            )
        if not evidence:
            evidence = ((0, *sources[answer]),)
    elif evidence:
        spans = np.asarray(sources)
        _, a, b = evidence[0]
        overlap = np.minimum(spans[:, 1], b) - np.maximum(spans[:, 0], a)
        answer = int(np.argmax(overlap)) if overlap.max() > 0 else -1
    return sources, -1 if answer is None else answer, evidence


# ---------------------------------------------------------------------------- plain metrics
def source_hit(scores: np.ndarray, answer: int, k: int) -> float:
    """1.0 when source ``answer`` is among the ``k`` highest of ``scores`` ``[S]``, counting every
    other source scored at least as high as above it; NaN when ``answer`` is unknown (< 0)."""
    scores = np.asarray(scores, dtype=float)
    if answer < 0 or answer >= len(scores):
        return float("nan")
    above = int((scores >= scores[answer]).sum()) - 1
    return float(above < k)


def token_precision(scores: np.ndarray, evidence: np.ndarray, considered: np.ndarray, k: int) -> float:
    """Of the ``k`` highest ``scores`` ``[N]`` among the ``considered`` positions (the earlier
    position first among equal scores; all of them when fewer than ``k``), the fraction that are
    ``evidence``; NaN when no considered position is evidence."""
    considered = np.asarray(considered, dtype=bool)
    evidence = np.asarray(evidence, dtype=bool) & considered
    if not evidence.any():
        return float("nan")
    idx = np.flatnonzero(considered)
    order = idx[np.argsort(-np.asarray(scores, dtype=float)[idx], kind="stable")][:k]
    return float(evidence[order].mean())


def lds_score(masks: np.ndarray, scores: np.ndarray, outputs: np.ndarray) -> float:
    """Spearman correlation between ``masks @ scores`` (the kept sources' summed scores, one per
    ablation: ``masks`` ``[n, S]`` bool, 1 = kept) and ``outputs`` ``[n]``; NaN when either is
    constant."""
    from scipy.stats import spearmanr

    predicted = np.asarray(masks, dtype=float) @ np.asarray(scores, dtype=float)
    outputs = np.asarray(outputs, dtype=float)
    ok = np.isfinite(outputs)
    if ok.sum() < 3 or np.ptp(predicted[ok]) == 0 or np.ptp(outputs[ok]) == 0:
        return float("nan")
    return float(spearmanr(predicted[ok], outputs[ok]).statistic)


# ---------------------------------------------------------------------------- measuring
@dataclass
class SourceAblations:
    """The target's log-probability under source ablations of B examples: ``ks`` ``[K]``;
    ``original`` ``[B]`` (nothing removed); ``removed`` ``[B, K]`` (the top-k sources removed;
    NaN where an example has fewer than k sources); ``masks[b]`` ``[n, S_b]`` bool (1 = kept) and
    ``outputs[b]`` ``[n]``: the random ablations."""

    ks: tuple[int, ...]
    original: np.ndarray
    removed: np.ndarray
    masks: list[np.ndarray]
    outputs: list[np.ndarray]


@dataclass
class SharedAblations:
    """Random-ablation outputs already measured, by example (text, target, sources) and
    setting: the methods of one run are scored on the same ablations, run once."""

    found: dict[tuple, tuple[float, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @staticmethod
    def key(expl: Explanation, protocol: Protocol, removal: int | None) -> tuple:
        target = expl.target
        return (
            expl.text, tuple(expl.raw_tokens), tuple(target.indices), tuple(target.positions or ()), tuple(expl.sources or ()),
            protocol.lds_ablations, protocol.lds_keep, removal,
        )


def _explained_batch(adapter: ModelAdapter, explanations: Sequence[Explanation]) -> tuple[Batch, ResolvedTarget]:
    """The explained token ids exactly (never re-tokenized) as one right-padded batch, and the
    explained target read as its log-probability."""
    tokenizer = adapter.tokenizer
    lengths = [len(e.tokens) for e in explanations]
    width = max(lengths)
    pad = adapter.pad_token_id if adapter.pad_token_id is not None else 0
    ids = torch.full((len(explanations), width), pad, dtype=torch.long)
    mask = torch.zeros(len(explanations), width, dtype=torch.long)
    special = torch.zeros(len(explanations), width, dtype=torch.bool)
    for b, e in enumerate(explanations):
        ids[b, : lengths[b]] = torch.tensor(tokenizer.convert_tokens_to_ids(e.raw_tokens), dtype=torch.long)
        mask[b, : lengths[b]] = 1
        special[b, : lengths[b]] = torch.tensor(e.special, dtype=torch.bool)
    batch = Batch(
        input_ids=ids, attention_mask=mask, token_type_ids=None, special_mask=special,
        texts=[e.text for e in explanations], text_pairs=[e.text_pair for e in explanations],
        tokens=[list(e.raw_tokens) for e in explanations], offsets=[list(e.offsets) for e in explanations],
        word_ids=[list(e.word_ids) for e in explanations], sequence_ids=[list(e.segments) for e in explanations],
    )
    spans = {e.target.positions is not None for e in explanations}
    widths = {len(e.target.indices) for e in explanations}
    if len(spans) != 1 or len(widths) != 1:
        raise InputError("explanations measured together must explain the same kind of target")
    weights = torch.ones(widths.pop())
    classes = torch.tensor([e.target.indices for e in explanations], dtype=torch.long)
    labels = [e.target.label for e in explanations]
    if spans.pop():
        positions = torch.tensor([e.target.positions for e in explanations], dtype=torch.long)
        return batch, ResolvedTarget(positions[:, -1], "fixed", classes, weights, labels, adapter.task, "log_prob", positions)
    anchor, kind = adapter.anchor_positions(batch)
    given = torch.tensor([e.target.anchor for e in explanations])
    if not torch.equal(anchor, given):
        raise HeedfulError("an explanation's anchor is not where this model reads it", hint="measure with the model that explained")
    if len(weights) == 2 and any(e.target.kind == "contrast" for e in explanations):
        weights = torch.tensor([1.0, -1.0])
    return batch, ResolvedTarget(anchor, kind, classes, weights, labels, adapter.task, "log_prob")


def source_owners(explanations: Sequence[Explanation], width: int) -> torch.Tensor:
    """``[B, N]`` the source of every token of every explanation (``-1``: none; only tokens of
    the first segment, as :meth:`~heedful.Explanation.source_scores` pools them)."""
    owners = torch.full((len(explanations), width), -1, dtype=torch.long)
    for b, e in enumerate(explanations):
        offsets = [o if seg == 0 else None for o, seg in zip(e.offsets, e.segments, strict=True)]
        owners[b, : len(offsets)] = torch.tensor(token_sources(offsets, e.sources or []), dtype=torch.long)
    return owners


def pooled_scores(expl: Explanation) -> np.ndarray:
    """``[S]`` the explanation's scores summed per source (last layer of layer-wise scores)."""
    scores = expl.source_scores("sum").scores
    return np.asarray(scores[-1] if scores.ndim == 2 else scores, dtype=float)


@torch.no_grad()
def measure_ablations(
    adapter: ModelAdapter,
    explanations: Sequence[Explanation],
    protocol: Protocol,
    shared: SharedAblations | None = None,
    chunk: int | None = None,
) -> SourceAblations:
    """The target's log-probability of every explanation with nothing removed, with its top-k
    sources removed (k in ``protocol.source_ks``) and under ``protocol.lds_ablations`` random
    ablations (each source kept with probability ``protocol.lds_keep``, drawn from a generator
    seeded from the example's text): all rows of the examples in one batched pass of the runner
    per kind of target (one token; a span of K tokens). ``shared``: random-ablation outputs
    measured before (by another method's run), used and filled."""
    if not explanations:
        raise InputError("no explanations to measure")
    missing = [b for b, e in enumerate(explanations) if e.sources is None]
    if missing:
        raise InputError(f"explanation {missing[0]} has no sources", hint="explain with sources=... (context data has them)")
    kinds: dict[tuple[bool, int], list[int]] = {}
    for b, e in enumerate(explanations):
        kinds.setdefault((e.target.positions is not None, len(e.target.indices)), []).append(b)
    if len(kinds) == 1:
        return _measure_kind(adapter, explanations, protocol, shared, chunk)
    ks = tuple(int(k) for k in protocol.source_ks)
    found = SourceAblations(ks, np.full(len(explanations), np.nan), np.full((len(explanations), len(ks)), np.nan),
                            [np.zeros((0, 0), dtype=bool)] * len(explanations), [np.zeros(0)] * len(explanations))
    for members in kinds.values():
        part = _measure_kind(adapter, [explanations[b] for b in members], protocol, shared, chunk)
        found.original[members], found.removed[members] = part.original, part.removed
        for j, b in enumerate(members):
            found.masks[b], found.outputs[b] = part.masks[j], part.outputs[j]
    return found


def _measure_kind(
    adapter: ModelAdapter,
    explanations: Sequence[Explanation],
    protocol: Protocol,
    shared: SharedAblations | None,
    chunk: int | None,
) -> SourceAblations:
    """:func:`measure_ablations` of explanations of one kind of target."""
    batch, target = _explained_batch(adapter, explanations)
    replacement = replacement_for(adapter, protocol, protocol.removal)
    owners = source_owners(explanations, batch.seq_len)  # [B, N]
    counts = [len(e.sources) for e in explanations]
    members = owners[:, None, :] == torch.arange(max(counts))[None, :, None]  # [B, S, N]
    ks = tuple(int(k) for k in protocol.source_ks)
    generators = example_generators(batch, 0)
    rows_ex: list[torch.Tensor] = []
    rows_remove: list[torch.Tensor] = []
    slots: list[tuple[int, str, int]] = []  # (example, "original" / "top" / "mask", index)
    masks: list[np.ndarray] = []
    cached: list[tuple[float, np.ndarray, np.ndarray] | None] = []
    for b, expl in enumerate(explanations):
        order = np.argsort(-pooled_scores(expl), kind="stable")
        found = None if shared is None else shared.found.get(SharedAblations.key(expl, protocol, replacement))
        cached.append(found)
        keep = torch.rand(protocol.lds_ablations, counts[b], generator=generators[b]) < protocol.lds_keep  # [n, S]
        masks.append(keep.numpy())
        removals = [torch.zeros(1, batch.seq_len, dtype=torch.bool)]
        slots.append((b, "original", 0))
        for j, k in enumerate(ks):
            if k <= counts[b]:
                removals.append(members[b, torch.from_numpy(order[:k].copy())].any(dim=0, keepdim=True))
                slots.append((b, "top", j))
        if found is None:
            dropped = (~keep).to(torch.float32) @ members[b, : counts[b]].to(torch.float32)  # [n, N]
            removals.append(dropped > 0)
            slots.extend((b, "mask", i) for i in range(protocol.lds_ablations))
        remove = torch.cat(removals)
        rows_remove.append(remove)
        rows_ex.append(torch.full((remove.shape[0],), b, dtype=torch.long))
    ex, remove = torch.cat(rows_ex), torch.cat(rows_remove)
    perturbed = never_empty(
        adapter,
        remove_tokens(
            batch.input_ids[ex], batch.attention_mask[ex], remove, target.anchor[ex], target.anchor_kind,
            replacement, adapter.pad_token_id,
        ),
    )
    runner = Runner(adapter, batch, target, rows=chunk)
    values = runner.map(Copies.of(perturbed, ex), lambda part, fwd: part.target.score(fwd.logits).double()).numpy()
    original = np.full(len(explanations), np.nan)
    removed = np.full((len(explanations), len(ks)), np.nan)
    outputs = [np.full(protocol.lds_ablations, np.nan) for _ in explanations]
    for (b, kind, j), value in zip(slots, values, strict=True):
        if kind == "original":
            original[b] = value
        elif kind == "top":
            removed[b, j] = value
        else:
            outputs[b][j] = value
    for b, expl in enumerate(explanations):
        if cached[b] is not None:
            masks[b], outputs[b] = cached[b][1], cached[b][2]
        elif shared is not None:
            shared.found[SharedAblations.key(expl, protocol, replacement)] = (float(original[b]), masks[b], outputs[b])
    return SourceAblations(ks, original, removed, masks, outputs)


def ablation_records(ablations: SourceAblations) -> list[dict]:
    """One JSON-ready dict per example (the results store's ``ablations`` measurements)."""
    return [
        {
            "ks": list(ablations.ks),
            "original": float(ablations.original[b]),
            "removed": ablations.removed[b].tolist(),
            "masks": ["".join("1" if v else "0" for v in row) for row in ablations.masks[b]],
            "outputs": ablations.outputs[b].tolist(),
        }
        for b in range(len(ablations.original))
    ]


def ablations_from_records(records: Sequence[dict]) -> SourceAblations:
    """:class:`SourceAblations` back from :func:`ablation_records` output."""
    ks = tuple(int(k) for k in records[0]["ks"])
    return SourceAblations(
        ks,
        np.array([r["original"] for r in records], dtype=float),
        np.array([r["removed"] for r in records], dtype=float).reshape(len(records), len(ks)),
        [np.array([[c == "1" for c in row] for row in r["masks"]], dtype=bool).reshape(len(r["masks"]), -1) for r in records],
        [np.asarray(r["outputs"], dtype=float) for r in records],
    )


# ---------------------------------------------------------------------------- references
def attach_context(m: Measurements, explanations: Sequence[Explanation], answers: Sequence[int] | None) -> Measurements:
    """Add what the context metrics compare: each explanation's pooled source scores (``None``
    without sources), the answer source of each (``answers``; -1 unknown) and the positions
    precision@k ranks (non-special tokens of the explained text, a span target's own tokens left
    out)."""
    m.source_scores = [pooled_scores(e) if e.sources is not None else None for e in explanations]
    m.answer_source = np.full(m.n, -1) if answers is None else np.asarray(answers, dtype=np.int64)
    content = []
    for e in explanations:
        keep = ~np.asarray(e.special, dtype=bool)
        if e.target.positions is not None:
            keep[e.target.positions[0] + 1 :] = False  # the span's tokens are what is explained
        content.append(keep)
    m.content = content
    return m


# ---------------------------------------------------------------------------- metrics
def bootstrap_aggregate(per: PerExample, protocol: Protocol) -> Summary:
    """Mean over the examples where the metric is defined, its standard deviation and a 95 %
    percentile bootstrap interval (1000 resamples, seed 0)."""
    finite = per.values[np.isfinite(per.values)]
    mean, low, high = bootstrap_mean(finite)
    curve = None
    if per.curves is not None and per.curves.size:
        with np.errstate(invalid="ignore"):
            curve = np.array([np.nanmean(c) if np.isfinite(c).any() else np.nan for c in per.curves.T])
    std = float(finite.std(ddof=1)) if finite.size > 1 else (0.0 if finite.size else float("nan"))
    return Summary(mean, std, int(finite.size), curve, low, high)


def _top(k: int):
    def compute(m: Measurements) -> PerExample:
        values = np.full(m.n, np.nan)
        for b, scores in enumerate(m.source_scores or [None] * m.n):
            if scores is not None and m.answer_source is not None:
                values[b] = source_hit(scores, int(m.answer_source[b]), k)
        return PerExample(values)

    return compute


register_metric("source_top1", family="context", source="evidence", higher_is_better=True,
                summary="the answer source is the highest-scored source", curve_kind=None,
                aggregate=bootstrap_aggregate)(_top(1))
register_metric("source_top3", family="context", source="evidence", higher_is_better=True,
                summary="the answer source is among the 3 highest-scored sources", curve_kind=None,
                aggregate=bootstrap_aggregate)(_top(3))


@register_metric("precision_at_k", family="plausibility", source="evidence", higher_is_better=True,
                 summary="fraction of the top-k tokens inside the answer span", curve_kind=None,
                 aggregate=bootstrap_aggregate)
def _precision_at_k(m: Measurements) -> PerExample:
    """Per example the precision, and in ``extras`` its ``hits`` and ``answer_tokens`` (the
    Mask-LRP code's precision@20 is the mean of the first over the mean of the second)."""
    values = np.full(m.n, np.nan)
    extras = []
    k = m.protocol.precision_k
    content = m.content or [np.ones(s.shape[-1], dtype=bool) for s in m.scores or []]
    for b, (scores, evidence, keep) in enumerate(zip(m.scores or [], m.evidence or [], content, strict=True)):
        row = scores[-1] if scores.ndim == 2 else scores
        values[b] = token_precision(row, evidence, keep, k)
        taken = min(k, int(keep.sum()))
        hits = float(values[b] * taken) if np.isfinite(values[b]) else 0.0
        extras.append({"hits": hits, "answer_tokens": float((np.asarray(evidence, dtype=bool) & keep).sum())})
    return PerExample(values, None, extras)


@register_metric("source_comprehensiveness", family="context", source="ablations", higher_is_better=True,
                 summary="log-probability drop when the top-k sources are removed", curve_kind="sources",
                 aggregate=bootstrap_aggregate, needs_probability=True)
def _source_comprehensiveness(m: Measurements) -> PerExample:
    ab = m.ablations
    if ab is None:
        raise InputError("source_comprehensiveness needs the ablations measurement")
    drops = ab.original[:, None] - ab.removed  # [B, K]
    with np.errstate(invalid="ignore"):
        values = np.array([np.nanmean(d) if np.isfinite(d).any() else np.nan for d in drops])
    return PerExample(values, drops)


@register_metric("lds", family="context", source="ablations", higher_is_better=True,
                 summary="Spearman of kept sources' scores with the log-probability over random ablations",
                 curve_kind=None, aggregate=bootstrap_aggregate, needs_probability=True)
def _lds(m: Measurements) -> PerExample:
    ab = m.ablations
    if ab is None:
        raise InputError("lds needs the ablations measurement")
    values = np.full(m.n, np.nan)
    for b, scores in enumerate(m.source_scores or [None] * m.n):
        if scores is not None and len(ab.masks[b]):
            values[b] = lds_score(ab.masks[b], scores, ab.outputs[b])
    return PerExample(values)
