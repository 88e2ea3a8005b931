"""The seed paper's studies of co-perturbation interest, as functions returning plain data.

- :func:`layer_map`: interest at layers 1..L of one sentence (Section 5.3, Figure 5), every
  layer optimised as its own problem in the same batched run.
- :func:`lambda_sweep`: interest of chosen words and the distortion (MLE) term against lambda
  (Section 5.2.1, Figure 4), every lambda its own problem in the same batched run, sharing the
  noise draws (common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from heedful.attribution import coperturbation as cp
from heedful.attribution.noise import NoiseProbe, resolve_layer
from heedful.engine.batch import Batch
from heedful.engine.problem import Problem
from heedful.errors import Hint, InputError
from heedful.model import Model

WORD_TOKENS = ("first", "last")


@dataclass
class LayerMap:
    """Interest of every token at every probed layer. ``scores`` ``[L', N]``: normalised ``rho``
    (content tokens sum to 1 per layer); ``sigma`` ``[L', N]``; ``layers``: the layer numbers."""

    text: str
    tokens: list[str]
    special: list[bool]
    layers: list[int]
    scores: np.ndarray
    sigma: np.ndarray
    steps: list[int]
    target: str


@dataclass
class LambdaSweep:
    """``interest`` ``[K, W]``: normalised ``rho`` of each chosen word at each lambda;
    ``distortion`` ``[K]``: expected normalised distortion at the estimated noise (re-measured
    with ``eval_samples`` fresh draws); ``objective`` ``[K]``; ``scores`` ``[K, N]``: every
    token's interest."""

    text: str
    tokens: list[str]
    words: list[str]
    lams: list[float]
    interest: np.ndarray
    distortion: np.ndarray
    objective: np.ndarray
    scores: np.ndarray
    target: str


def settings_from(options: dict) -> cp.Settings:
    """:class:`~heedful.attribution.coperturbation.Settings` from keyword options (unknown keys
    raise an :class:`InputError` naming the known ones)."""
    known = {f.name for f in fields(cp.Settings)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)}", hint=f"known options: {', '.join(sorted(known))}")
    return cp.Settings(**options)


def layer_map(
    model: Model, text: str, *, target=None, layers: list[int] | None = None, seed: int | None = 0, **options
) -> LayerMap:
    """Co-perturbation interest of ``text``'s tokens at each of ``layers`` (default 1..L; negative
    numbers count from the end), distortion measured on all tokens' states at that layer.
    ``options``: :class:`~heedful.attribution.coperturbation.Settings` fields (``lam``,
    ``max_steps``, ``samples``, ...)."""
    adapter = model.adapter
    wanted = layers or list(range(1, adapter.num_layers + 1))
    keys = [resolve_layer(adapter, k) for k in wanted]
    problem = model.prepare([text], target, hidden_states=True)
    batch, resolved = problem.batch, problem.target
    fit, _ = cp.estimate_interest(problem, layers=list(keys), settings=settings_from(options), seed=seed)
    n = int(batch.lengths[0])
    content = batch.content_mask[[0] * len(keys)]
    real = batch.attention_mask.bool()[[0] * len(keys)]
    scores = cp.interest_scores(fit.sigma, content, real)
    return LayerMap(
        text=text,
        tokens=adapter.readable_tokens(batch.input_ids[0, :n].tolist(), batch.tokens[0]),
        special=batch.special_mask[0, :n].tolist(),
        layers=keys,
        scores=scores[:, :n].numpy().astype(np.float64),
        sigma=fit.sigma[:, :n].numpy().astype(np.float64),
        steps=fit.steps.tolist(),
        target=resolved.labels[0],
    )


def word_positions(batch: Batch, words: list[str], token: str = "first") -> list[int]:
    """Token position standing for each word of ``words`` in example 0 (its first occurrence,
    matched case-insensitively): the word's first (head) or last (tail) token (paper 5.2)."""
    if token not in WORD_TOKENS:
        raise InputError(f"unknown word_token {token!r}", hint=f"use one of {', '.join(WORD_TOKENS)}")
    text = batch.texts[0]
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(batch.word_ids[0]):
        if w is not None:
            groups.setdefault(w, []).append(i)
    found: dict[str, list[int]] = {}
    for idx in groups.values():
        start, end = batch.offsets[0][idx[0]][0], batch.offsets[0][idx[-1]][1]
        found.setdefault(text[start:end].lower(), idx)
    positions = []
    for word in words:
        idx = found.get(word.lower())
        if idx is None:
            raise InputError(f"word {word!r} is not in the text", hint=f"the text's words: {', '.join(found)}")
        positions.append(idx[0] if token == "first" else idx[-1])
    return positions


@torch.no_grad()
def expected_distortion(
    problem: Problem,
    sigma: torch.Tensor,
    key: int,
    samples: int = 32,
    seed: int | None = 0,
    space: str = "embedding_output",
    output: str = "logits",
) -> torch.Tensor:
    """Mean normalised distortion of example 0 under noise stds ``sigma`` ``[K, N]`` (one row per
    setting), from ``samples`` fresh draws each, all in one batched forward -> ``[K]``."""
    probe = NoiseProbe.build(problem, (key,), space, output)
    rows, seq = sigma.shape
    gen = torch.Generator().manual_seed(10_007 + (0 if seed is None else int(seed)))
    z = torch.randn((samples, seq, probe.dim), generator=gen)  # shared draws: common random numbers
    noise = (sigma[:, None, :, None] * z[None]).reshape(rows * samples, seq, probe.dim)
    example = torch.zeros(rows * samples, dtype=torch.long)
    keys = torch.full((rows * samples,), key, dtype=torch.long)
    return probe.distortion(example, keys, noise).view(rows, samples).mean(dim=1)


def lambda_sweep(
    model: Model,
    text: str,
    words: list[str],
    lams: list[float] | None = None,
    *,
    target=None,
    layer: int | None = None,
    word_token: str = "first",
    eval_samples: int = 32,
    seed: int | None = 0,
    **options,
) -> LambdaSweep:
    """Interest of ``words`` in ``text`` and the distortion term against ``lams`` (default 0.1,
    0.2, ..., 1.0; the paper's Figure 4 marks 0.6), all lambdas optimised together."""
    lams = list(lams) if lams else [round(0.1 * k, 1) for k in range(1, 11)]
    if not words:
        raise InputError("no words given", hint=Hint('name at least one word of the text, e.g. words=["charming"]', "name at least one word of the text, e.g. --words charming"))
    adapter = model.adapter
    problem = model.prepare([text], target, hidden_states=True)
    batch, resolved = problem.batch, problem.target
    positions = word_positions(batch, words, word_token)
    key = resolve_layer(adapter, layer)
    settings = settings_from(options)
    fit, _ = cp.estimate_interest(problem, layers=[layer], lams=lams, settings=settings, seed=seed)
    n = int(batch.lengths[0])
    content = batch.content_mask[[0] * len(lams)]
    real = batch.attention_mask.bool()[[0] * len(lams)]
    scores = cp.interest_scores(fit.sigma, content, real)
    dist = expected_distortion(problem, fit.sigma, key, eval_samples, seed, settings.space, settings.output)
    return LambdaSweep(
        text=text,
        tokens=adapter.readable_tokens(batch.input_ids[0, :n].tolist(), batch.tokens[0]),
        words=list(words),
        lams=[float(x) for x in lams],
        interest=scores[:, positions].numpy().astype(np.float64),
        distortion=dist.numpy().astype(np.float64),
        objective=fit.objective.numpy().astype(np.float64),
        scores=scores[:, :n].numpy().astype(np.float64),
        target=resolved.labels[0],
    )
