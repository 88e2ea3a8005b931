"""The many-sentence studies of the co-perturbation report (``heedful reproduce coperturbation``).

Each function takes a loaded model and sentences and returns plain numbers per sentence; the
report (:mod:`heedful.reproduce.coperturbation`) summarises them with 95 % bootstrap intervals.

- :func:`rank_agreement`: Spearman correlation and top-20 % overlap of two explanations'
  content-token scores (the linearized against the optimised solution, two seeds).
- :func:`lambda_units`: what the default (normalised) ``lambda`` is in the paper's units, per
  sentence, and what the paper's ``lambda = 0.6`` does when taken in its own units.
- :func:`lambda_study`: over many sentences, the linearized interest and the *measured*
  distortion at a grid of ``lambda`` (paper Section 5.2.1, Figure 4, as mean curves).
- :func:`layer_study`: over many sentences, linearized interest at every layer (Section 5.3,
  Figure 5, as mean curves): how concentrated it is and how it agrees with the head's.
- :func:`probe_stability`: seed stability of Hutchinson's estimate at a layer, per probe count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from heedful.attribution import coperturbation as cp
from heedful.attribution.noise import HEAD, NoiseProbe
from heedful.explanation import Explanation
from heedful.model import Model
from heedful.reproduce.toolkit import spearman

TOP_SHARE = 0.2
"""Share of a sentence's content tokens counted as its top tokens (overlap, concentration)."""
STUDY_LAMS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)
STUDY_BATCH = 16
DISTORTION_SAMPLES = 4
"""Fresh noise draws per sentence and lambda for the measured distortion of :func:`lambda_study`."""


def _top(scores: np.ndarray, share: float = TOP_SHARE) -> set[int]:
    k = max(1, math.ceil(share * scores.size))
    return set(np.argsort(-scores, kind="stable")[:k].tolist())


def rank_agreement(a: Explanation, b: Explanation) -> tuple[float, float]:
    """Spearman correlation of two explanations' content-token scores (NaN when either is
    constant) and the share of ``a``'s top-20 % content tokens that are in ``b``'s."""
    keep = ~np.asarray(a.special)
    sa, sb = np.asarray(a.scores)[keep], np.asarray(b.scores)[keep]
    top_a, top_b = _top(sa), _top(sb)
    return spearman(sa, sb), len(top_a & top_b) / len(top_a)


def constant(e: Explanation) -> bool:
    """All content tokens have the same score (e.g. every token's noise at the ceiling)."""
    keep = ~np.asarray(e.special)
    return bool(np.ptp(np.asarray(e.scores)[keep]) <= 1e-9 * max(1e-30, float(np.abs(e.scores[keep]).max())))


def _batches(texts: Sequence[str], size: int = STUDY_BATCH) -> Iterator[list[str]]:
    for start in range(0, len(texts), size):
        yield list(texts[start : start + size])


def lambda_units(model: Model, texts: Sequence[str], lam: float = cp.Settings.lam) -> dict[str, np.ndarray]:
    """Per sentence: ``lambda_paper = lam * M * E[phi^2] / (2 N D)``, the paper-unit ``lambda``
    with the same minimiser as the normalised objective at ``lam`` (``M`` logits, ``N`` tokens,
    ``D`` width; see :mod:`heedful.attribution.coperturbation`); and the share of tokens whose
    linearized noise sits at the ceiling for the normalised ``lam`` and for ``objective="paper"``
    at the same number ``lam`` (the paper's 0.6 read in its own units)."""
    paper_lam, at_ceiling_norm, at_ceiling_paper = [], [], []
    for chunk in _batches(texts):
        problem = model.prepare(chunk, None, hidden_states=True)
        probe = NoiseProbe.build(problem, (HEAD,))
        ex = torch.arange(len(chunk))
        lengths = problem.batch.lengths.float()
        m = probe.elements(ex, HEAD).float()
        paper_lam += (lam * m * probe.energy[HEAD] / (2 * lengths * probe.dim)).tolist()
        real = problem.batch.attention_mask.bool()
        for objective, out in (("normalised", at_ceiling_norm), ("paper", at_ceiling_paper)):
            settings = cp.Settings(lam=lam, solver="linearized", objective=objective)
            fit, _ = cp.estimate_interest(problem, settings=settings)
            top = fit.sigma.pow(2) >= fit.scale.pow(2)[:, None] * (1 - 1e-5)
            out += ((top & real).sum(dim=1).float() / real.sum(dim=1)).tolist()
    return {
        "lambda_paper": np.asarray(paper_lam),
        "at_ceiling_normalised": np.asarray(at_ceiling_norm),
        "at_ceiling_paper": np.asarray(at_ceiling_paper),
    }


def _content_scores(fit_sigma: torch.Tensor, problem, rows_example: torch.Tensor) -> torch.Tensor:
    batch = problem.batch
    return cp.interest_scores(fit_sigma, batch.content_mask[rows_example], batch.attention_mask.bool()[rows_example])


def concentration(scores: np.ndarray) -> float:
    """Share of the (non-negative) interest mass on the top-20 % tokens."""
    total = scores.sum()
    return float(scores[list(_top(scores))].sum() / total) if total > 0 else math.nan


def lambda_study(
    model: Model, texts: Sequence[str], lams: Sequence[float] = STUDY_LAMS, seed: int = 0, samples: int = DISTORTION_SAMPLES
) -> dict[str, np.ndarray]:
    """Linearized interest at each ``lams`` (normalised objective) of every sentence, and per
    sentence x lambda ``[S, K]``: the measured normalised distortion at that noise
    (``samples`` fresh draws; common across lambdas), the first-order prediction of it, the
    share of tokens at the ceiling, and the Spearman correlation of the ranking with the one at
    ``lambda = 0.6``."""
    lams = list(lams)
    k = len(lams)
    ref = lams.index(0.6) if 0.6 in lams else len(lams) // 2
    measured, predicted, ceiling, agree = [], [], [], []
    for chunk in _batches(texts):
        problem = model.prepare(chunk, None, hidden_states=True)
        batch = problem.batch
        bsz, seq = len(chunk), batch.seq_len
        fit, _ = cp.estimate_interest(problem, lams=lams, settings=cp.Settings(solver="linearized"), seed=seed)
        probe = NoiseProbe.build(problem, (HEAD,))
        rows_example = torch.arange(bsz).repeat_interleave(k)
        scores = _content_scores(fit.sigma, problem, rows_example).view(bsz, k, seq)
        gen = torch.Generator().manual_seed(7919 + seed)
        z = torch.randn((bsz, samples, seq, probe.dim), generator=gen) * batch.attention_mask[:, None, :, None]
        dist = torch.zeros(bsz, k)
        sigma = fit.sigma.view(bsz, k, seq)
        with torch.no_grad():
            for j in range(k):  # one batched forward of every sentence's draws per lambda
                noise = (sigma[:, j, None, :, None] * z).reshape(bsz * samples, seq, probe.dim)
                ex = torch.arange(bsz).repeat_interleave(samples)
                dist[:, j] = probe.distortion(ex, torch.full_like(ex, HEAD), noise).view(bsz, samples).mean(dim=1)
        real = batch.attention_mask.bool()
        top = (fit.sigma.pow(2) >= fit.scale.pow(2)[:, None] * (1 - 1e-5)).view(bsz, k, seq) & real[:, None]
        measured.append(dist.numpy())
        predicted.append(fit.distortion.view(bsz, k).numpy())
        ceiling.append((top.sum(dim=2).float() / real.sum(dim=1, keepdim=True)).numpy())
        content = batch.content_mask.bool()
        for b in range(bsz):
            keep = content[b].numpy()
            rows = scores[b][:, keep].numpy()
            agree.append([spearman(rows[j], rows[ref]) for j in range(k)])
    return {
        "lams": np.asarray(lams),
        "measured": np.concatenate(measured),
        "predicted": np.concatenate(predicted),
        "at_ceiling": np.concatenate(ceiling),
        "spearman_to_ref": np.asarray(agree),
        "ref": np.asarray(lams[ref]),
    }


def layer_study(model: Model, texts: Sequence[str], probes: int = cp.Settings.probes, seed: int = 0) -> dict[str, np.ndarray]:
    """Linearized interest (normalised objective, default ``lambda``) at every layer 1..L of
    every sentence, distortion measured on all tokens' states at that layer (paper Section 5.3),
    and at the head. Per sentence x layer ``[S, L]``: the concentration (share of the content
    tokens' interest on their top 20 %) and the Spearman correlation with the head's ranking."""
    n_layers = model.adapter.num_layers
    layers: list[int | None] = [None, *range(1, n_layers + 1)]
    conc, agree = [], []
    began = time.perf_counter()
    for chunk in _batches(texts):
        problem = model.prepare(chunk, None, hidden_states=True)
        batch = problem.batch
        bsz, seq = len(chunk), batch.seq_len
        settings = cp.Settings(solver="linearized", probes=probes)
        fit, _ = cp.estimate_interest(problem, layers=layers, settings=settings, seed=seed)
        rows_example = torch.arange(bsz).repeat_interleave(len(layers))
        scores = _content_scores(fit.sigma, problem, rows_example).view(bsz, len(layers), seq)
        content = batch.content_mask.bool()
        for b in range(bsz):
            rows = scores[b][:, content[b]].numpy()
            conc.append([concentration(rows[j]) for j in range(len(layers))])
            agree.append([spearman(rows[j], rows[0]) for j in range(1, len(layers))])
    conc_arr = np.asarray(conc)
    return {
        "layers": np.arange(1, n_layers + 1),
        "concentration": conc_arr[:, 1:],
        "head_concentration": conc_arr[:, 0],
        "spearman_to_head": np.asarray(agree),
        "seconds_per_sentence": np.asarray((time.perf_counter() - began) / max(1, len(texts))),
    }


def probe_stability(
    model: Model, texts: Sequence[str], layer: int, probe_counts: Sequence[int], seeds: tuple[int, int] = (0, 1)
) -> dict[int, dict[str, float | list[float]]]:
    """Spearman correlation per sentence between the linearized interest at ``layer`` with two
    seeds of Hutchinson's probes, and the wall time per sentence, for each probe count."""
    found: dict[int, dict[str, float | list[float]]] = {}
    for probes in probe_counts:
        rhos: list[float] = []
        began = time.perf_counter()
        for chunk in _batches(texts):
            problem = model.prepare(chunk, None, hidden_states=True)
            content = problem.batch.content_mask.bool()
            runs = []
            for seed in seeds:
                fit, _ = cp.estimate_interest(problem, layers=[layer], settings=cp.Settings(solver="linearized", probes=probes), seed=seed)
                runs.append(_content_scores(fit.sigma, problem, torch.arange(len(chunk))))
            for b in range(len(chunk)):
                rhos.append(spearman(runs[0][b, content[b]].numpy(), runs[1][b, content[b]].numpy()))
        seconds = (time.perf_counter() - began) / max(1, len(texts)) / len(seeds)
        found[int(probes)] = {"spearman": rhos, "seconds": seconds}
    return found
