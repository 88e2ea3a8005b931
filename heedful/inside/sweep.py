"""The sentiment steering sweep: how often a steered language model writes what a sentiment
classifier calls positive, and what that costs in fluency, over a range of coefficients.

For each coefficient ``c`` every prompt (the first words of a movie-review snippet) is continued
greedily steered ``c`` times (:class:`~heedful.inside.steering.Steerer`: ``c * vector`` added by a
:class:`~heedful.inside.steering.SteeringVector`, or the heads shifted by ``c`` standard deviations
by an inference-time intervention, :class:`~heedful.inside.iti.HeadIntervention`); a judge
(a sentiment classifier, e.g. ``minilm-sentiment``) labels each *continuation alone*;
**success** is the share labelled ``toward``, with its Wilson 95 % interval; **fluency** is the
unsteered model's perplexity of the continuation given the prompt (``exp`` of the mean
token negative log-likelihood), summarised as the geometric mean over prompts (``exp`` of the
mean log-perplexity) with a 95 % bootstrap interval (:func:`heedful.evaluate.intervals.bootstrap_mean`
on the log-perplexities). Coefficient 0 is the unsteered baseline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from heedful.datasets import Dataset
from heedful.errors import InputError
from heedful.evaluate.intervals import bootstrap_mean
from heedful.generation import Generation
from heedful.inside.steering import Steerer
from heedful.progress import task

Z95 = 1.959963984540054


def wilson(successes: int, n: int) -> tuple[float, float]:
    """The Wilson score 95 % interval of a proportion ``successes / n``."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    low = 0.0 if successes == 0 else centre - half  # exactly 0 (1) at p = 0 (1), not float residue
    high = 1.0 if successes == n else centre + half
    return (low, high)


def snippet_prompts(dataset: Dataset, words: int = 6, label=None, n: int | None = None) -> list[str]:
    """The first ``words`` words of the first ``n`` snippets (of label ``label`` only, when
    given) that have more words than that."""
    chosen = [e.text for e in dataset if label is None or str(e.label) == str(label)]
    prompts = [" ".join(text.split()[:words]) for text in chosen if len(text.split()) > words][:n]
    if not prompts:
        raise InputError(f"no snippet has more than {words} words", hint="use a smaller --prompt-words or more texts")
    return prompts


@dataclass
class SweepRow:
    """One coefficient: success rate and interval, geometric-mean perplexity and interval, and
    the first continuations (for reading)."""

    coefficient: float
    success: float
    success_low: float
    success_high: float
    perplexity: float
    perplexity_low: float
    perplexity_high: float
    n: int
    examples: list[str]


@dataclass
class SweepResult:
    """``layer``: the steering vector's block (``None`` for a steerer of several, see ``where``);
    ``kind``: the steerer's kind (``caa``, ``mean``, ``iti``, ...)."""

    toward: str
    layer: int | None
    rows: list[SweepRow]
    prompts: list[str]
    seconds: float = 0.0
    kind: str = ""
    where: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def continuation_log_perplexity(lm, generation: Generation, batch_size: int = 8) -> np.ndarray:
    """``[B]``: each continuation's mean token negative log-likelihood under ``lm`` (unsteered)
    given its prompt (``nan`` for an empty continuation)."""
    batch = generation.batch
    found = np.full(len(batch), np.nan)
    for start in range(0, len(batch), batch_size):
        rows = list(range(start, min(start + batch_size, len(batch))))
        sub = batch.select(rows)
        with torch.no_grad():
            logits = lm.hf_model(
                input_ids=sub.input_ids.to(lm.adapter.device), attention_mask=sub.attention_mask.to(lm.adapter.device)
            ).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), sub.input_ids[:, 1:].to(logits.device), reduction="none")
        for i, b in enumerate(rows):
            p, t = generation.prompt_lengths[b], len(generation.continuations[b])
            if t:
                found[b] = float(nll[i, p - 1 : p - 1 + t].mean())
    return found


def sentiment_sweep(
    lm,
    judge,
    prompts: Sequence[str],
    vector: Steerer,
    coefficients: Sequence[float],
    *,
    toward: str = "POSITIVE",
    max_new_tokens: int = 20,
    batch_size: int = 8,
    seed: int = 0,
    shown: int = 3,
) -> SweepResult:
    """The sweep of the module docstring; ``toward`` is one of ``judge``'s labels."""
    if toward not in judge.labels:
        raise InputError(f"the judge has no label {toward!r}", hint=f"one of {', '.join(judge.labels)}")
    if not prompts or not coefficients:
        raise InputError("the sweep needs prompts and coefficients", hint="give at least one of each")
    rows, began = [], time.perf_counter()
    with task("steering sweep", len(coefficients) * len(prompts)) as progress:
        for c in coefficients:
            texts, logppl = [], []
            for start in range(0, len(prompts), batch_size):
                chunk = list(prompts[start : start + batch_size])
                generation = vector.generate(lm, chunk, float(c), max_new_tokens)
                texts += [lm.tokenizer.decode(ids, skip_special_tokens=True) for ids in generation.continuations]
                logppl += continuation_log_perplexity(lm, generation, batch_size).tolist()
                progress.advance(len(chunk))
            judged = [p["label"] for p in judge.predict([t if t.strip() else "." for t in texts], batch_size=32)]
            hits = sum(label == toward for label in judged)
            low, high = wilson(hits, len(texts))
            values = np.asarray([v for v in logppl if np.isfinite(v)])
            mean, plow, phigh = bootstrap_mean(values, seed=seed)
            rows.append(SweepRow(float(c), hits / len(texts), low, high, math.exp(mean), math.exp(plow), math.exp(phigh), len(texts), texts[:shown]))
    return SweepResult(toward, vector.layer, rows, list(prompts), time.perf_counter() - began, vector.kind, vector.where)
