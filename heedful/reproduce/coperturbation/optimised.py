"""The co-perturbation report's lambda and layer studies with the optimised solver (Algorithm 1,
Adam), over the study's sentences -- beside the linearized studies of
:mod:`heedful.reproduce.coperturbation_studies`, whose first-order solution cannot reorder tokens
by lambda (lambda only scales every token's variance there).

Every number comes from plain ``coperturbation`` explanations under their complete options --
``lam`` on the study's grid, ``layerwise=True`` (interest at every layer, ``[L, N]``), a second
``seed`` at the default lambda -- kept in the report's results store part by part
(:func:`explained`), so an interrupted run resumes and the default-lambda explanations of the
faithfulness benchmark are reused, not recomputed.

- :func:`lambda_order` (paper Section 5.2.1, Figure 4a: lambda changes which of two words gets
  more interest): per sentence, the ranking's Spearman correlation and top token against the
  default lambda's, and whether the order of the sentence's two leading content tokens differs
  between the grid's smallest and largest lambda -- against the same order's change between two
  seeds at the default lambda (the solver's own noise), paired over sentences.
- :func:`layer_concentration` (Section 5.3, Figure 5): per sentence and layer, the share of the
  content tokens' interest on their top 20 % and the Spearman correlation with the head's
  interest, as :func:`~heedful.reproduce.coperturbation_studies.layer_study` gives them for the
  linearized solver.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from heedful.engine.memory import peak_rss_mb
from heedful.evaluate.store import ResultsStore, RunKey
from heedful.explanation import Explanation
from heedful.progress import task
from heedful.reproduce.coperturbation_studies import STUDY_LAMS, concentration
from heedful.reproduce.toolkit import spearman

if TYPE_CHECKING:
    from heedful.model import Model

PART = 16
"""Sentences explained and stored together (an interrupted run loses at most one part)."""
LAYERWISE_PART = 4
"""The same for the layer-wise run, whose every sentence is one optimisation per layer."""
REFERENCE_LAM = 0.6
"""The default (normalised) lambda the grid's rankings are compared with."""
LAMS = (STUDY_LAMS[0], REFERENCE_LAM, STUDY_LAMS[-1])
"""The linearized study's smallest and largest lambda and the default: the claim reads the ends
(at about 20 s of one core per sentence and lambda, the linearized study's inner points are
left to it and to the one-sentence sweep)."""


def explained(
    model: Model, db: ResultsStore, key: RunKey, ids: Sequence[str], texts: Sequence[str], options: Mapping[str, Any], title: str
) -> dict[str, Explanation]:
    """``coperturbation`` explanations of ``texts`` (ids ``ids``) under ``options``: those ``db``
    holds under ``key``, the rest computed :data:`PART` sentences at a time (:data:`LAYERWISE_PART`
    with ``layerwise=True``) and stored with their cost as each part finishes."""
    found = db.get_explanations(key, list(ids))
    todo = [k for k, i in enumerate(ids) if i not in found]
    size = LAYERWISE_PART if options.get("layerwise") else PART
    with task(title, total=len(todo), shown=bool(todo)) as done:
        for start in range(0, len(todo), size):
            part = todo[start : start + size]
            began = time.perf_counter()
            fresh = model.explain([texts[k] for k in part], "coperturbation", None, batch_size=len(part), **options)
            items = [(ids[k], e) for k, e in zip(part, fresh, strict=True)]
            db.record_explained(key, items, time.perf_counter() - began, peak_rss_mb())
            found.update(items)
            done.advance(len(part))
    return found


def _content(e: Explanation) -> np.ndarray:
    """Content-token scores (``[N']``, or ``[L, N']`` for layer-wise scores)."""
    keep = ~np.asarray(e.special, dtype=bool)
    return np.asarray(e.scores, dtype=float)[..., keep]


def _leading_pair(rows: list[np.ndarray]) -> tuple[int, int]:
    """The two content positions with the largest mean interest over ``rows`` (each run's content
    scores, normalised to sum 1; ties by position)."""
    mean = np.mean([r / max(float(np.abs(r).sum()), 1e-30) for r in rows], axis=0)
    order = np.argsort(-mean, kind="stable")
    return int(order[0]), int(order[1])


def _reversed(a: np.ndarray, b: np.ndarray, pair: tuple[int, int]) -> bool:
    """The pair's order is strictly opposite in ``a`` and ``b`` (a tie in either is no reversal)."""
    i, j = pair
    return float(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])) < 0


def lambda_order(
    per_lam: Mapping[float, Mapping[str, Explanation]], other_seed: Mapping[str, Explanation], ids: Sequence[str],
    reference: float = REFERENCE_LAM,
) -> dict[str, np.ndarray]:
    """Per sentence of ``ids`` (at least two content tokens): ``spearman_to_ref`` and
    ``top_same`` ``[S, K]`` -- the ranking's Spearman correlation with the ``reference`` lambda's
    and whether its top content token is the reference's -- and ``flip_lambda`` / ``flip_seed``
    ``[S]``: whether the order of the sentence's two leading content tokens (largest mean interest
    over every run) is reversed between the grid's smallest and largest lambda, and between two
    seeds at ``reference`` (``other_seed``); ``spearman_seed`` / ``top_same_seed`` ``[S]``: the
    second seed's ranking against the reference's. ``per_lam``: lambda -> explanations, one seed."""
    lams = sorted(per_lam)
    ref = lams.index(reference)
    agree, same, flip_lam, flip_seed, kept, seed_agree, seed_same = [], [], [], [], [], [], []
    for i in ids:
        rows = [_content(per_lam[lam][i]) for lam in lams]
        seed_row = _content(other_seed[i])
        if rows[ref].size < 2:
            continue
        pair = _leading_pair([*rows, seed_row])
        agree.append([spearman(r, rows[ref]) for r in rows])
        same.append([int(np.argmax(r)) == int(np.argmax(rows[ref])) for r in rows])
        flip_lam.append(_reversed(rows[0], rows[-1], pair))
        flip_seed.append(_reversed(rows[ref], seed_row, pair))
        seed_agree.append(spearman(seed_row, rows[ref]))
        seed_same.append(int(np.argmax(seed_row)) == int(np.argmax(rows[ref])))
        kept.append(i)
    return {
        "lams": np.asarray(lams), "ref": np.asarray(reference), "ids": np.asarray(kept),
        "spearman_to_ref": np.asarray(agree, dtype=float), "top_same": np.asarray(same, dtype=float),
        "flip_lambda": np.asarray(flip_lam, dtype=float), "flip_seed": np.asarray(flip_seed, dtype=float),
        "spearman_seed": np.asarray(seed_agree, dtype=float), "top_same_seed": np.asarray(seed_same, dtype=float),
    }


def layer_concentration(layerwise: Mapping[str, Explanation], head: Mapping[str, Explanation], ids: Sequence[str]) -> dict[str, np.ndarray]:
    """Per sentence of ``ids``: ``concentration`` ``[S, L]`` of the layer-wise interest (layers
    1..L), ``head_concentration`` ``[S]`` of the head's, and ``spearman_to_head`` ``[S, L]`` --
    the keys of :func:`~heedful.reproduce.coperturbation_studies.layer_study`."""
    conc, heads, agree = [], [], []
    for i in ids:
        rows, top = _content(layerwise[i]), _content(head[i])
        conc.append([concentration(r) for r in rows])
        heads.append(concentration(top))
        agree.append([spearman(r, top) for r in rows])
    conc_arr = np.asarray(conc, dtype=float)
    return {
        "layers": np.arange(1, conc_arr.shape[1] + 1) if conc_arr.size else np.zeros(0, dtype=int),
        "concentration": conc_arr, "head_concentration": np.asarray(heads, dtype=float),
        "spearman_to_head": np.asarray(agree, dtype=float),
    }


def study_runs(options: Mapping[str, Any], seed: int) -> list[tuple[str, dict[str, Any]]]:
    """Every run of the optimised studies as (title, its complete ``coperturbation`` options):
    each lambda of :data:`LAMS` with ``seed``, ``seed + 1`` at :data:`REFERENCE_LAM`, and
    layer-wise interest with ``seed``. ``options``: the report's co-perturbation options."""
    runs = [(f"lambda = {lam:g}", {**options, "seed": seed, "lam": lam}) for lam in LAMS]
    runs.append((f"seed {seed + 1}", {**options, "seed": seed + 1, "lam": REFERENCE_LAM}))
    runs.append(("every layer", {**options, "seed": seed, "layerwise": True}))
    return runs


def explain_runs(model: Model, store, about, ids: Sequence[str], texts: Sequence[str], runs, say=print) -> list[dict[str, Explanation]]:
    """The explanations of each of ``runs`` (:func:`study_runs`' items) of ``texts`` (ids ``ids``,
    on ``about``, a :class:`~heedful.evaluate.store.Subject`), from / into the results ``store``."""
    from heedful.evaluate.store import run_key

    found = []
    with ResultsStore(store) as db:
        for title, options in runs:
            say(f"optimised co-perturbation, {title}, on {len(ids)} sentences")
            found.append(explained(model, db, run_key(about, "coperturbation", options), ids, texts, options, title))
    return found


def optimised_studies(
    model: Model, store, about, ids: Sequence[str], texts: Sequence[str], options: Mapping[str, Any], seed: int,
    say=print,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Explain the study's sentences with every run of :func:`study_runs` (from / into
    ``store``; the reference lambda's are the benchmark's) and return (:func:`lambda_order`,
    :func:`layer_concentration`)."""
    *per_lam, other, layers = explain_runs(model, store, about, ids, texts, study_runs(options, seed), say)
    by_lam = dict(zip(LAMS, per_lam, strict=True))
    return lambda_order(by_lam, other, ids), layer_concentration(layers, by_lam[REFERENCE_LAM], ids)
