"""Faithfulness against cost of every registered sequence-classification method: the frontier.

On the first ``--n`` held-out sentences of the movies test split and ``minilm-sentiment`` this
script

1. explains every sentence with every method that claims classification and runs on the model
   (context methods, which rank sources of a prompt, are left out), at its defaults, and the rows
   of :data:`VARIANTS` (a method with other options, labelled ``method[key=value,...]``; so is
   any row ``--methods`` names), cheapest first (by its cost model); its **cost** is the forward-pass equivalents per example it ran
   (counted; a backward counts two, Kaplan et al. 2020), beside what its cost model
   (:func:`heedful.engine.workload.passes`) predicted;
2. scores every explanation under protocol ``default`` (NormXLogit's: ratios 0..1, AOPC and
   sufficiency averaged over 10..90 %) with each removal operator of a cross-operator
   evaluation (:data:`heedful.evaluate.operators.CROSS_OPERATORS`: deletion, ``[MASK]``, and a
   corpus word of the same part of speech), soft comprehensiveness / sufficiency (Zhao &
   Aletras 2023) and, when the model's fine-tuned copy is built (:data:`FFIDELITY`), F-Fidelity's
   FFid+ / FFid- under the replacement operator it was fine-tuned with (Zheng et al. 2024;
   :mod:`heedful.evaluate.ffidelity`), and the counterfactual tests of Ye et
   al. 2021 (:mod:`heedful.inside.counterfactual`: the share of sentences where replacing the top
   word by a movie-snippet word of its tag, or negating the top adjective, lowers p(class) by 0.05 more
   than the same edit of a control word) -- so a method tuned to one operator
   (``solvability_beam`` solves comprehensiveness under ``[MASK]``) is scored on the others;
3. gives every mean its 95 % percentile bootstrap interval over sentences, and every comparison
   of two methods the paired interval of their per-sentence difference
   (:mod:`heedful.evaluate.intervals`);
4. marks the Pareto front of AOPC (``[MASK]``, the model's own removal) against cost, evaluates
   the targets of the frontier issue and prints each as holds / does not hold with the closest
   method;
5. writes the table, the targets and the plot to ``--out`` and the front to
   ``heedful/frontier.json`` (read by ``heedful methods`` and the page's method picker).

``smollm2-sentiment`` (200 sentences at full size) is measured too when it is built; otherwise
the script says so and skips it (``heedful models build smollm2-sentiment``).
ROAR (retraining without each method's top tokens, Hooker et al. 2019) costs a retrain per method,
fraction and seed, so ``benchmarks/roar.py`` measures it apart; the file links its results.

Resuming. Every explanation, its timing and every metric value is kept in a ``heedful bench``
results store (``--store``, default ``$HEEDFUL_HOME/frontier``; :mod:`frontier_store`) as each
model batch finishes, keyed by the model's fingerprint, the method with its options and version,
the protocol (operator) and the sentence. Ctrl-C keeps what was computed, writes nothing to
``--out`` and exits 130; the same command then computes only what is missing. ``--report-only``
writes the report from whatever the store holds, stating the sentences each method reached (a
method short of ``--n`` is marked and scored on the sentences it has). ``--share i/k`` measures
every k-th method from the i-th (k processes side by side on one store, e.g. one per core with
``--threads 1``); each writes no report -- run ``--report-only`` once all have finished. The
store moves between machines with ``heedful bench dump`` / ``heedful bench load``. F-Fidelity's
values are keyed by the fine-tuned copy's weights, and a copy rebuilt on another processor has
other weights (training sums in another order): the report reads the values of the copy the store
holds most of (this machine's on a tie) and names it when it is not this machine's, so a moved
store writes the table the measuring machine wrote. ``--measure-stored`` explains nothing and
measures F-Fidelity on this machine's copy (and the counterfactual tests) of every stored
explanation that lacks them. A row without F-Fidelity is still reported (its FFid
cells read "not yet", and target 1 does not hold for it): on ``smollm2-sentiment`` F-Fidelity
took 13.6 min for two rows on 2 cores beside another job, so it reaches the rows a few at a time.

    python benchmarks/frontier.py [--n 500] [--methods NAME,...] [--skip NAME,...]
        [--models NAME,...] [--max-cost inf] [--samples 4] [--threads 2] [--store DIR] [--share i/k]
        [--report-only | --measure-stored] [--out docs/results/frontier.md]

``--max-cost`` leaves out methods whose cost model exceeds that many forward-pass equivalents
per example (listed in the file; default: none left out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from _shared import command_line, library_versions, run_line, write_results  # noqa: E402  (benchmarks/ is the script's folder)
from frontier_store import (
    FFID,
    PROTOCOL,
    Frontier,
    Reading,
    labels,
    measure,
    measure_stored,
    model_frontier,
    other_ffidelity,
    read,
    split_label,
    with_ffidelity_read,
)
from scipy.stats import spearmanr

import heedful
from heedful.adapters.needs import NEEDS
from heedful.attribution import get_method
from heedful.engine.workload import passes
from heedful.errors import HeedfulError, Interrupted
from heedful.evaluate.ffidelity import FFID_BETA
from heedful.evaluate.intervals import bootstrap_mean, bootstrap_paired_difference
from heedful.evaluate.share import Share
from heedful.evaluate.store import ResultsStore
from heedful.files.cache import heedful_home
from heedful.frontier import FRONTIER
from heedful.registry import registered
from heedful.render.progress import MODES, show_progress
from heedful.zoo import is_built

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = {"minilm-sentiment": 500, "smollm2-sentiment": 200}
"""Models measured and their full size (sentences)."""
FFIDELITY = {"minilm-sentiment": "minilm-sentiment-ffidelity", "smollm2-sentiment": "smollm2-sentiment-ffidelity"}
"""Each model's copy fine-tuned with random removal (F-Fidelity), when it has one."""
DATASET, SPLIT = "movies", "test"
load_model = heedful.load
"""How a model of :data:`MODELS` / :data:`FFIDELITY` is loaded (tests put tiny models here)."""
PEERS = {
    "saliency": "Captum, Inseq, ferret",
    "grad_x_input": "Captum, Inseq, ferret",
    "integrated_gradients": "Captum, Inseq, ferret",
    "smoothgrad": "Captum",
    "occlusion": "Captum, Inseq",
    "leave_one_out": "Captum (FeatureAblation)",
    "lime": "Captum, Inseq, ferret",
    "kernel_shap": "Captum, ferret",
    "lrp": "Captum",
    "attnlrp": "LXT",
    "raw_attention": "Inseq",
    "value_zeroing": "Inseq",
    "random": "",
}
"""Methods a peer toolkit offers (Captum, Inseq, ferret, LXT); every other one is heedful's own."""
VARIANTS = ("solvability_beam[objective=both]", "solvability_beam[beam=1,shortlist=4]", "solvability_beam[beam=1,shortlist=5]",
            "solvability_beam[beam=1,shortlist=4,trailing_specials=true]", "solvability_beam[beam=1,shortlist=5,trailing_specials=true]",
            "solvability_beam[trailing_specials=true]",
            "solvability_beam[objective=both,trailing_specials=true]",
            "solvability_beam[beam=1,shortlist=6,prior=attnlrp,trailing_specials=true]", "solvability_beam[beam=1,shortlist=6,prior=attnlrp]",
            "solvability_beam[beam=1,shortlist=6,prior=attnlrp,removal=unk]", "solvability_beam[removal=unk]",
            "solvability_beam[beam=1,shortlist=6,prior=attnlrp,objective=both,removal=unk,also_removal=delete]",
            "solvability_beam[beam=1,shortlist=3,refresh=6,removal=unk]")
"""Rows measured beside every method at its defaults: a method with other options -- the beam
search on Zhou & Shah's combined target (comprehensiveness minus sufficiency) besides its default
comprehensiveness, its lazy greedy form with two shortlists (about a tenth of the default's
passes), and the lazy, default and combined searches ordering ``[SEP]`` with the words, as
protocol ``default`` ranks it; and the lazy search shortlisting by AttnLRP's ranking instead of a first
step that removes every token once, with and without the trailing specials (a causal LM's text has
none to order), and under ``[UNK]``: a causal LM's search deletes by default (``removal="auto"``),
while its headline column, without a ``[MASK]`` token, is ``[UNK]``; the default beam search
under ``[UNK]`` too (about ten times the lazy one's passes); and the lazy search on the
combined target summed over ``[UNK]`` and deletion (``also_removal``), which a search under one
operator loses to the peers on the other; and the lazy search under ``[UNK]`` that measures every
token left again every sixth step (``refresh``), the lazy form closest to the full greedy search
under a tenth of the default beam's passes on smollm2-sentiment."""
AOPC_GAIN = 1.10  # heedful's best >= 110 % of the best peer AOPC
CHEAP_SHARE, CHEAP_COST = 0.95, 0.1  # >= 95 % of the best AOPC at <= 1/10 of its cost


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", "--limit", type=int, default=None, dest="n",
                        help="sentences per model (default: full size, 500 on minilm-sentiment, 200 on smollm2-sentiment)")
    parser.add_argument("--models", default=None, help=f"comma-separated models (default: {', '.join(MODELS)})")
    parser.add_argument("--methods", default=None, help="comma-separated methods, each optionally with options: "
                        "lime,solvability_beam[objective=both,beam=8] (default: every classification method at its defaults, and VARIANTS)")
    parser.add_argument("--skip", default="", help="comma-separated methods to leave out")
    parser.add_argument("--max-cost", type=float, default=math.inf,
                        help="leave out methods whose cost model exceeds this many forward-pass equivalents per example (default: none)")
    parser.add_argument("--samples", type=int, default=4, help="F-Fidelity draws per example and ratio")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="sentences per model batch (explaining and scoring)")
    parser.add_argument("--store", type=Path, default=None, help="folder of the results store (default: $HEEDFUL_HOME/frontier)")
    parser.add_argument("--report-only", action="store_true", help="compute nothing: write the report from what the store holds")
    parser.add_argument("--measure-stored", action="store_true",
                        help="compute no explanation: measure F-Fidelity and the counterfactual tests of every stored explanation "
                        "that lacks them (a store moved to a machine whose fine-tuned copy was rebuilt), then write the report")
    parser.add_argument("--share", default=None, help="i/k: measure every k-th method from the i-th and write no report")
    parser.add_argument("--progress", choices=MODES, default="auto", help="progress bars on stderr (auto: on a terminal)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "frontier.md")
    parser.add_argument("--front", type=Path, default=FRONTIER, help="where the front is written for heedful methods and the page")
    args = parser.parse_args(argv)
    args.share = Share.parse(args.share, "--share")
    if args.report_only and args.share.of > 1:
        parser.error("--report-only reads the whole store: drop --share")
    if args.report_only and args.measure_stored:
        parser.error("--report-only computes nothing: drop --measure-stored, or --report-only")
    if args.n is not None and args.n < 1:
        parser.error("--n must be a positive number of sentences")
    args.models = args.models.split(",") if args.models else list(MODELS)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"--models: {', '.join(unknown)} is not one of {', '.join(MODELS)}")
    args.store = args.store or heedful_home() / "frontier"
    return args


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- choosing
def offered(label: str) -> str | None:
    """The peers offering the row's method (``""``: the random baseline; ``None``: heedful's own)."""
    return PEERS.get(split_label(label)[0])


def chosen_methods(model: heedful.Model, args: argparse.Namespace, lengths: np.ndarray) -> tuple[list[str], dict[str, float], list[str]]:
    """The rows to run (methods, some with options), cheapest first by their cost model, that
    model's forward-pass equivalents per example, and the ones left out (with why)."""
    runs = model.methods()
    names = labels(args.methods) if args.methods else [n for n, i in registered().items() if "classification" in i.tasks] + list(VARIANTS)
    skip = set(labels(args.skip))
    chosen, costs, left = [], {}, []
    for label in names:
        method, options = split_label(label)
        info = get_method(method)
        if info.needs_sources or label in skip or info.name in skip:
            left.append(f"`{label}`: {'ranks sources of a prompt (context attribution)' if info.needs_sources else 'skipped (--skip)'}")
            continue
        if runs.get(info.name):
            left.append(f"`{label}`: the model does not give it {'; '.join(NEEDS[n] for n in runs[info.name])}")
            continue
        bound = info.bind(options)
        cost = float(np.mean([(lambda f, b: f + 2 * b)(*passes(info, bound, int(n))) for n in lengths]))
        if cost > args.max_cost:
            left.append(f"`{label}`: {cost:,.0f} forward-pass equivalents per example, above --max-cost {args.max_cost:g}")
            continue
        chosen.append(label)
        costs[label] = cost
    return sorted(chosen, key=lambda m: (costs[m], m)), costs, left


# ---------------------------------------------------------------------------- analysing
COLUMNS = {  # key: (heading, higher is better)
    "aopc_mask": ("AOPC [MASK]", True), "aopc_unk": ("AOPC [UNK]", True), "aopc_delete": ("AOPC delete", True),
    "aopc_sample": ("AOPC sampled", True), "sufficiency_mask": ("suff. [MASK]", False), "sufficiency_unk": ("suff. [UNK]", False),
    "sufficiency_delete": ("suff. delete", False), "sufficiency_sample": ("suff. sampled", False),
    "soft_comprehensiveness": ("soft comp.", True), "soft_sufficiency": ("soft suff.", True),
    "ffid_plus": ("FFid+", True), "ffid_minus": ("FFid-", False),
    "counterfactual_replace": ("cf. replace", True), "counterfactual_negate": ("cf. negate", True),
}


def primary(found: dict) -> str:
    return "aopc_mask" if "aopc_mask" in found else "aopc_unk"


def pareto(costs: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``[M]`` bool: no other method is at most as costly and at least as faithful, better in one.

    ``values``: ``[M]`` means, or ``[M, N]`` per sentence with NaN where a method was not
    measured; then each pair of methods is compared over the sentences both have (a row measured
    on the first 40 sentences is neither placed above nor pushed off by another's mean over 500).
    """
    values = np.asarray(values, dtype=float).reshape(len(costs), -1)
    finite = np.isfinite(values)
    both = finite[:, None, :] & finite[None, :, :]  # [a, b, N]
    count = both.sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(both, values[:, None, :], 0.0).sum(axis=2) / count  # [a, b]: a's mean where b is measured too
    theirs, mine = mean.T, mean  # [a, b]: b's mean and a's mean over the sentences both have
    dominated = (costs[None, :] <= costs[:, None]) & (theirs >= mine) & (count > 0)
    dominated &= (costs[None, :] < costs[:, None]) | (theirs > mine)
    return ~dominated.any(axis=1)


def interval(values: np.ndarray) -> tuple[float, float, float]:
    return bootstrap_mean(values[np.isfinite(values)])


def _on(m: str, reached: dict[str, int], n: int) -> str:
    """`` (on 12 of 20 sentences)`` for a method short of ``n``."""
    return "" if reached[m] >= n else f" (on {reached[m]} of {n} sentences)"


def shared(values: dict[str, np.ndarray], a: str, b: str) -> tuple[tuple[float, float, float], tuple[float, float, float], int]:
    """The intervals of methods ``a`` and ``b`` over the sentences both have (a method short of
    the frontier's size is compared where it was measured), and how many those are."""
    both = np.isfinite(values[a]) & np.isfinite(values[b])
    return interval(values[a][both]), interval(values[b][both]), int(both.sum())


def share_of(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Row ``a`` as a share of row ``b`` over the sentences both have: the ratio of their means
    and the paired difference's 95% interval mapped onto it (``1 + (a - b) / mean(b)``)."""
    both = np.isfinite(a) & np.isfinite(b)
    diff, low, high = bootstrap_paired_difference(a[both], b[both])
    base = b[both].mean()
    return 1 + diff / base, 1 + low / base, 1 + high / base


def _over(k: int, n: int) -> str:
    """``, over the 12 sentences both have`` when two methods share fewer than ``n``."""
    return "" if k >= n else f", over the {k} sentences both have"


TARGET_COLUMNS = frozenset({"aopc_delete", "aopc_sample", "sufficiency_mask", "sufficiency_unk", "sufficiency_delete",
                            "sufficiency_sample", "ffid_plus", "ffid_minus"})
"""The evaluations target 1 names besides AOPC [MASK]: F-Fidelity and the cross-operator scores."""


@dataclass(frozen=True)
class Against:
    """One heedful row against the best peer row on the sentences both have: AOPC intervals and
    ratio, the paired AOPC gain, every other column's paired difference, where it is worse, and
    the named evaluations with no sentence measured for both (F-Fidelity not reached yet)."""

    intervals: tuple
    ratio: float
    apart: bool
    gain: tuple[float, float, float]
    paired: dict[str, tuple[float, float, float]]
    worse: list[str]
    worse_elsewhere: list[str]
    unmeasured: list[str]

    @property
    def holds(self) -> bool:
        return self.ratio >= AOPC_GAIN and self.apart and not self.worse and not self.unmeasured


def against(found: dict, key: str, ours: str, peer: str) -> Against:
    """Row ``ours`` against row ``peer``; worse: the paired interval wholly on the bad side (below
    0, or above it where lower is better)."""
    ours_at, peer_at, k = shared(found[key], ours, peer)
    both = {c: np.isfinite(found[c][ours]) & np.isfinite(found[c][peer]) for c in found if c != key}
    paired = {c: bootstrap_paired_difference(found[c][ours], found[c][peer]) for c in both if both[c].any()}
    bad = {c: f"{COLUMNS[c][0]} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for c, (d, lo, hi) in paired.items() if (hi < 0 if COLUMNS[c][1] else lo > 0)}
    return Against((ours_at, peer_at, k), ours_at[0] / peer_at[0], ours_at[1] > peer_at[2],
                   bootstrap_paired_difference(found[key][ours], found[key][peer]), paired,
                   [t for c, t in bad.items() if c in TARGET_COLUMNS], [t for c, t in bad.items() if c not in TARGET_COLUMNS],
                   [COLUMNS[c][0] for c in both if c not in paired and c in TARGET_COLUMNS])


def target_one(found: dict) -> tuple[str, str, Against] | None:
    """Target 1's pair: the best peer row (by mean AOPC) and the heedful row closest to beating
    it -- the one that holds; else the largest margin among rows measured on and worse on none of
    the named evaluations; else the largest margin -- with the verdict. ``None`` without a row of
    each."""
    key = primary(found)
    ours = [m for m in found[key] if offered(m) is None]
    peers = [m for m in found[key] if offered(m)]
    if not (ours and peers):
        return None
    best_peer = max(peers, key=lambda m: interval(found[key][m])[0])
    verdicts = {m: against(found, key, m, best_peer) for m in ours}
    best_ours = max(ours, key=lambda m: (verdicts[m].holds, not verdicts[m].worse and not verdicts[m].unmeasured, verdicts[m].ratio))
    return best_ours, best_peer, verdicts[best_ours]


def shared_cost(found: dict, costs: dict[str, float], sentence_cost: dict[str, np.ndarray], a: str, b: str) -> tuple[float, float]:
    """The costs of rows ``a`` and ``b`` over the sentences both have AOPC of, each sentence's as
    its stored explanation records it -- a search's passes grow with a text's length, so a row
    measured on fewer sentences is costed on the same ones as the row it is held against; the
    rows' own costs where either lacks a sentence's record."""
    key = primary(found)
    ca, cb = sentence_cost.get(a), sentence_cost.get(b)
    if ca is None or cb is None:
        return costs[a], costs[b]
    both = np.isfinite(found[key][a]) & np.isfinite(found[key][b])
    if not both.any() or not (np.isfinite(ca[both]).all() and np.isfinite(cb[both]).all()):
        return costs[a], costs[b]
    return float(ca[both].mean()), float(cb[both].mean())


def targets(
    found: dict, costs: dict[str, float], reached: dict[str, int], n: int, sentence_cost: dict[str, np.ndarray] | None = None
) -> list[str]:
    """The issue's targets, each as holds / does not hold with the closest method; the methods
    are chosen by their mean AOPC and compared over the sentences both have -- AOPC and, for the
    cheap method, cost (:func:`shared_cost`)."""
    key = primary(found)
    means = {m: interval(v) for m, v in found[key].items()}
    lines = []
    if (one := target_one(found)) is not None:
        best_ours, best_peer, v = one
        (ours_at, peer_at, k), gain, paired = v.intervals, v.gain, v.paired
        lines.append(
            f"- heedful's best method beats the best peer method by >= {AOPC_GAIN - 1:.0%} AOPC with intervals apart, "
            f"and is not worse (paired) on F-Fidelity and the cross-operator scores: **{'holds' if v.holds else 'does not hold'}**. "
            f"Closest (the row that holds, else the largest margin among rows measured and not worse on those): `{best_ours}`{_on(best_ours, reached, n)} "
            f"{ours_at[0]:.3f} [{ours_at[1]:.3f}, {ours_at[2]:.3f}] "
            f"against `{best_peer}` ({offered(best_peer)}){_on(best_peer, reached, n)} {peer_at[0]:.3f} "
            f"[{peer_at[1]:.3f}, {peer_at[2]:.3f}]{_over(k, n)}: {v.ratio:.1%} of it, intervals {'apart' if v.apart else 'overlapping'}, "
            f"paired difference {gain[0]:+.3f} [{gain[1]:+.3f}, {gain[2]:+.3f}]"
            + (f"; worse (paired) on {', '.join(v.worse)}" if v.worse else f"; not worse (paired) on any of them{' measured' if v.unmeasured else ''}")
            + (f"; not measured for both: {', '.join(v.unmeasured)}" if v.unmeasured else "")
            + (f"; worse on evaluations the target does not name: {', '.join(v.worse_elsewhere)}" if v.worse_elsewhere else "") + "."
        )
        lines.append(
            f"  Paired differences `{best_ours}` - `{best_peer}` per sentence (higher is better except sufficiency and FFid-): "
            + "; ".join(f"{COLUMNS[k][0]} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for k, (d, lo, hi) in paired.items()) + "."
        )
    best = max(means, key=lambda m: means[m][0])
    against_best = {m: shared_cost(found, costs, sentence_cost or {}, m, best) for m in means}
    cheap = [m for m, (mine, theirs) in against_best.items() if mine <= CHEAP_COST * theirs]
    if cheap:
        closest = max(cheap, key=lambda m: means[m][0])
        cheap_at, best_at, k = shared(found[key], closest, best)
        share = cheap_at[0] / best_at[0]
        holds = share >= CHEAP_SHARE
        d, lo, hi = bootstrap_paired_difference(found[key][closest], found[key][best])
        _, low_share, high_share = share_of(found[key][closest], found[key][best])
        mine, theirs = against_best[closest]
        where = "" if k >= reached[closest] else f" (over the {k} sentences both have; over all its own {reached[closest]}: {costs[closest]:,.0f})"
        lines.append(
            f"- one method reaches >= {CHEAP_SHARE:.0%} of the best AOPC at <= 1/10 of its cost: **{'holds' if holds else 'does not hold'}**. "
            f"Best: `{best}`{_on(best, reached, n)} {best_at[0]:.3f} at {theirs:,.0f} forward passes; closest at <= {CHEAP_COST * theirs:,.0f}: "
            f"`{closest}`{_on(closest, reached, n)} {cheap_at[0]:.3f} ({share:.1%}{_over(k, n)}) at {mine:,.0f}{where}; "
            f"paired difference {d:+.3f} [{lo:+.3f}, {hi:+.3f}], {low_share:.1%} to {high_share:.1%} of the best."
        )
    else:
        lines.append(f"- one method reaches >= {CHEAP_SHARE:.0%} of the best AOPC at <= 1/10 of its cost: **does not hold** "
                     f"(the best, `{best}`, costs {costs[best]:,.0f} forward passes; no method costs a tenth of that).")
    return lines


def table(found: dict, costs: dict[str, float], model_costs: dict[str, float], seconds: dict[str, float],
          front: dict[str, bool], reached: dict[str, int], n: int) -> list[str]:
    keys = [k for k in COLUMNS if k in found]
    heads = ["method", "offered by", "sentences", "cost (fwd-eq)", "cost model", "s / sentence", *(COLUMNS[k][0] for k in keys), "front"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    order = sorted(costs, key=lambda m: -interval(found[primary(found)][m])[0])
    for m in order:
        size = f"{reached[m]}" if reached[m] >= n else f"**{reached[m]} of {n}**"
        by = offered(m)
        cells = [f"`{m}`", "heedful" if by is None else by or "(baseline)", size, f"{costs[m]:,.0f}", f"{model_costs[m]:,.0f}", f"{seconds[m]:.3f}"]
        for k in keys:
            mean, low, high = interval(found[k][m])
            cells.append("not yet" if math.isnan(mean) else f"{mean:.3f} [{low:.3f}, {high:.3f}]")
        cells.append("**on the front**" if front[m] else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(path: Path, found: dict, costs: dict[str, float], front: dict[str, bool], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = primary(found)
    fig, ax = plt.subplots(figsize=(9, 6))
    names = list(costs)
    for m in names:
        mean, low, high = interval(found[key][m])
        color = "tab:red" if front[m] else ("tab:blue" if offered(m) is None else "tab:gray")
        ax.errorbar(costs[m], mean, yerr=[[mean - low], [high - mean]], fmt="o", color=color, capsize=2, ms=4)
        ax.annotate(m, (costs[m], mean), fontsize=7, xytext=(3, 3), textcoords="offset points")
    on = sorted((costs[m], interval(found[key][m])[0]) for m in names if front[m])
    ax.step([c for c, _ in on], [v for _, v in on], where="post", color="tab:red", lw=1, label="Pareto front")
    ax.set_xscale("log")
    ax.set_xlabel("cost: forward-pass equivalents per example (log)")
    ax.set_ylabel(f"{COLUMNS[key][0]} (95 % bootstrap interval)")
    ax.set_title(title, fontsize=10)
    ax.scatter([], [], color="tab:blue", label="heedful's own")
    ax.scatter([], [], color="tab:gray", label="offered by a peer")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------- one model
def setup(name: str, full: int, args: argparse.Namespace) -> tuple[Frontier, list[str], dict[str, float], list[str]]:
    """The model's frontier on the store, its methods (cheapest first), their cost models and
    the methods left out."""
    model = load_model(name)
    copy = FFIDELITY.get(name)
    finetuned = load_model(copy) if copy and is_built(copy) else None
    front = model_frontier(name, model, args.n or full, args.store, DATASET, SPLIT, args.batch_size, finetuned, args.samples)
    lengths = model.encode([i.text for i in front.inputs]).lengths.numpy()
    names, model_costs, left = chosen_methods(model, args, lengths)
    return front, names, model_costs, left


def this_share(names: list[str], share: Share) -> list[str]:
    """The rows of ``names`` this process measures: every k-th from the i-th (``--share i/k``)."""
    return [m for j, m in enumerate(names) if share.takes(j)]


def compute(front: Frontier, names: list[str], model_costs: dict[str, float], left: list[str], args: argparse.Namespace) -> None:
    """Measure this process's share of ``names`` on ``front``, what the store lacks of each;
    a method the model refuses at run time is added to ``left``. Ctrl-C raises
    :class:`~heedful.errors.Interrupted`."""
    mine = this_share(names, args.share)
    with ResultsStore(args.store) as store:
        have = {m: len(front.complete(store, front.run(m))) for m in mine}
    todo = [m for m in mine if have[m] < len(front.ids)]
    say(f"{front.name}: {len(mine) - len(todo)} of {len(mine)} methods already stored whole for {len(front.ids)} sentences"
        f" in {args.store}; measuring {len(todo)}" + (f" (share {args.share})" if args.share.of > 1 else ""))
    for k, m in enumerate(todo):
        say(f"[{k + 1}/{len(todo)}] {front.name}: {m} (cost model {model_costs[m]:,.0f} fwd-eq per sentence; {have[m]} of {len(front.ids)} stored)")
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            measure(front, m, progress=args.progress != "never", say=say)
        except HeedfulError as exc:
            left.append(f"`{m}`: {str(exc).splitlines()[0]}")
            say(f"  {m}: left out ({str(exc).splitlines()[0]})")
            continue
        say(f"  {m}: done in {time.perf_counter() - wall:,.0f} s wall, {time.process_time() - cpu:,.0f} s CPU (explaining and every evaluation)")


def report(front: Frontier, names: list[str], model_costs: dict[str, float], left: list[str], reading: Reading,
           args: argparse.Namespace) -> tuple[list[str], dict | None]:
    """The model's section of the results file and its record for ``heedful/frontier.json``
    (``None`` when the store holds no sentence of any method)."""
    name, n = front.name, len(front.ids)
    measured = [m for m in names if m in reading.reached]
    missing = [m for m in names if m not in reading.reached]
    if not measured:
        return [f"## {name}", "", f"Nothing of `{name}` is stored in {args.store} yet: run this script without --report-only.", ""], None
    found = {k: v for k, v in reading.values.items() if v}
    costs, seconds = {}, {}
    for m in measured:
        record = reading.cost[m]
        counted = (record["forward"] + 2 * record["backward"]) / record["examples"] if record and record["examples"] else 0.0
        costs[m] = counted if counted > 0 else model_costs[m]  # explanations merged in without a cost record: the model's
        seconds[m] = record["seconds"] / record["examples"] if record and record["examples"] else math.nan
    key = primary(found)
    on = dict(zip(measured, pareto(np.array([costs[m] for m in measured]), np.stack([found[key][m] for m in measured])), strict=True))
    png = args.out.with_name(f"{args.out.stem}-{name}.png")
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(png, found, costs, on, f"{name}: {n} movies test sentences, protocol {PROTOCOL}")
    short = {m: reading.reached[m] for m in measured if reading.reached[m] < n}
    lines = [
        f"## {name}: {n} movies test sentences (full size {MODELS[name]})",
        "",
        f"![AOPC against cost, {name}]({png.name})",
        "",
        "Sentences reached: " + (f"all {n} by every method." if not short else
                                 f"all {n} by {len(measured) - len(short)} of {len(measured)} methods; fewer by (bold in the table, "
                                 f"scored on the sentences they have): {', '.join(f'`{m}` {k}' for m, k in short.items())}."),
        "",
        *table(found, costs, model_costs, seconds, on, reading.reached, n),
        "",
        "Pareto front (cheapest first): " + ", ".join(f"`{m}`" for m in sorted(measured, key=lambda m: costs[m]) if on[m]) + ".",
        "",
        "Targets (issue 43, item 4):",
        "",
        *targets(found, costs, reading.reached, n, reading.sentence_cost),
        "",
    ]
    lines += ffidelity_note(front, [m for m in measured if not np.isfinite(found.get("ffid_plus", {}).get(m, np.nan)).any()], len(measured))
    lines += copies_note(front, found, measured)
    if missing:
        lines += ["Not measured yet (no sentence stored whole): " + ", ".join(f"`{m}`" for m in missing) + ".", ""]
    if left:
        lines += ["Left out: " + "; ".join(left) + ".", ""]
    record = {
        "model": name, "examples": n, "data": "movies test sentences", "protocol": PROTOCOL,
        "methods": {m: {"cost": round(costs[m], 1), **dict(zip(("aopc", "low", "high"), (round(v, 4) for v in interval(found[key][m])), strict=True)),
                        "front": bool(on[m]), **({"examples": short[m]} if m in short else {}),
                        **({"options": options} if (options := split_label(m)[1]) else {})} for m in measured},
    }
    return lines, record


def ffidelity_note(front: Frontier, unreached: list[str], rows: int) -> list[str]:
    """The report's lines on F-Fidelity: which copy its values were measured on when that is not
    this machine's (a store moved from another processor), the rows it has not reached, or why
    it is not measured at all."""
    name, read = front.name, front.ffid_read
    copy = FFIDELITY.get(name, "a fine-tuned copy")
    if read is None:
        return [f"F-Fidelity: not measured (`{copy}` is not built" + (f": `heedful models build {copy}`)." if name in FFIDELITY else ")."), ""]
    said = []
    if not read.local:
        here = (f"is not built here (`heedful models build {copy}`)" if front.ffid is None
                else f"has weights `{front.ffid[3]['f_fidelity']['model']}` and {read.here:,} values")
        said.append(f"F-Fidelity on `{copy}` is read as the store holds it: {read.rows:,} FFid+ values measured on the copy with weights "
                    f"`{read.copy}`, fine-tuned on another machine (training on another processor lands on other weights). This "
                    f"machine's copy {here}; `--measure-stored` measures the stored rows on it, and the report reads it once it has as many.")
    if unreached:
        said.append(f"F-Fidelity measured for {rows - len(unreached)} of {rows} rows; not yet (`--measure-stored` adds it to stored rows): "
                    + ", ".join(f"`{m}`" for m in unreached) + ".")
    return [" ".join(said), ""] if said else []


def copies_note(front: Frontier, found: dict, measured: list[str]) -> list[str]:
    """How far F-Fidelity depends on the fine-tuned copy, for each other copy the store holds
    values of (one fine-tuned on another processor): over the rows measured on both -- each row's
    mean over the sentences both copies have -- the Spearman correlation of the rows' means and the
    largest difference of a row's mean, per FFid column; and target 1's pair compared on that copy."""
    lines = []
    one = target_one(found) if "ffid_plus" in found else None
    for other in other_ffidelity(front):
        with ResultsStore(front.store) as store:
            theirs = {c: v for c, v in read(store, replace(front, ffid_read=other), measured, only=FFID).values.items() if v}
        said = []
        for c in FFID:
            pairs = {}
            for m in measured:
                a, b = found.get(c, {}).get(m), theirs.get(c, {}).get(m)
                both = np.zeros(0, bool) if a is None or b is None else np.isfinite(a) & np.isfinite(b)
                if both.any():
                    pairs[m] = (float(a[both].mean()), float(b[both].mean()))
            if len(pairs) < 3:
                continue
            ours, other_means = np.array(list(pairs.values())).T
            rho = float(spearmanr(ours, other_means).statistic)
            far = max(pairs, key=lambda m: abs(pairs[m][0] - pairs[m][1]))
            said.append(f"{COLUMNS[c][0]}: {len(pairs)} rows, Spearman {rho:.3f}, largest difference of a row's mean "
                        f"{pairs[far][1] - pairs[far][0]:+.4f} (`{far}`)")
        if not said:
            continue
        text = (f"F-Fidelity on another copy the store holds, weights `{other.copy}` ({other.rows:,} FFid+ values; the table reads "
                f"`{front.ffid_read.copy}`), against the table's, over the rows and sentences measured on both: " + "; ".join(said) + ".")
        if one is not None and all(c in theirs for c in FFID):
            ours_row, peer_row, _ = one
            there = against({**found, **theirs}, primary(found), ours_row, peer_row)
            paired = [f"{COLUMNS[c][0]} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for c, (d, lo, hi) in there.paired.items() if c in FFID]
            if paired:
                worse = [t for t in there.worse if t.startswith("FFid")]
                text += (f" Target 1's pair on that copy, `{ours_row}` - `{peer_row}`: " + "; ".join(paired)
                         + (f": worse (paired) on {', '.join(worse)}." if worse else ": not worse (paired)."))
        lines += [text, ""]
    return lines


def roar_note(path: Path) -> str:
    """Where ROAR stands: it retrains a classifier per method, fraction and seed, so
    ``benchmarks/roar.py`` measures it apart (and resumes it from its store) in ``path``."""
    where = f"in [{path.name}]({path.name}), which states its cost" if path.exists() else f"in {path.name} (not generated yet)"
    return ("ROAR (Hooker et al. 2019: each method's top-k % tokens removed from the train and test snippets and "
            f"{next(iter(MODELS))} retrained on them) costs a retrain per method, fraction and seed, minutes each: "
            f"`benchmarks/roar.py` measures it apart, {where}.")


def ceiling_note(path: Path) -> str:
    """Where the AOPC ceiling stands: the best ranking's AOPC on the sentences short enough to
    search exactly, from ``benchmarks/aopc_ceiling.py`` (which reads this script's store)."""
    where = f"[{path.name}]({path.name})" if path.exists() else f"{path.name} (not generated yet)"
    pooled = path.with_name("search-optimality.md")
    there = f"[{pooled.name}]({pooled.name})" if pooled.exists() else f"{pooled.name} (not generated yet)"
    return ("The most any ranking can score: `benchmarks/aopc_ceiling.py` finds the exact AOPC [MASK] and sufficiency [MASK] "
            f"optimum of every sentence short enough to search all its orderings and sets each method against it, in {where}; "
            f"on sentences of any length, `benchmarks/search_optimality.py` finds the best reordering of each search row's own "
            f"top tokens, in {there}.")


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    sections, tasks, sizes = [], {}, []
    try:
        with show_progress(args.progress):
            for name in args.models:
                full = MODELS[name]
                if not is_built(name):
                    message = f"`{name}` is not built here: skipped (build it with `heedful models build {name}`, then run this script again)."
                    say(message)
                    sections += [f"## {name}", "", message, ""]
                    continue
                front, names, model_costs, left = setup(name, full, args)
                if args.measure_stored:
                    for m in this_share(names, args.share):
                        measure_stored(front, m, say=say)
                elif not args.report_only:
                    compute(front, names, model_costs, left, args)
                if args.share.of > 1:
                    continue
                front = with_ffidelity_read(front)
                with ResultsStore(args.store) as store:
                    reading = read(store, front, names)
                lines, record = report(front, names, model_costs, left, reading, args)
                sections += lines
                if record is not None:
                    tasks.setdefault("classification", record)  # the first model measured is the task's frontier
                    short = sum(1 for m in record["methods"].values() if "examples" in m)
                    sizes.append(f"{record['examples']} sentences on {name}" + (f" ({short} of {len(record['methods'])} methods on fewer)" if short else ""))
    except KeyboardInterrupt as exc:
        kept = exc.message if isinstance(exc, Interrupted) else "interrupted"
        say(f"{kept}\nthe frontier store {args.store} keeps every model batch finished; nothing was written to {args.out}. "
            "Run the same command to resume, or add --report-only to write the report from what the store holds.")
        return 130
    except HeedfulError as exc:
        say(f"error: {exc}")
        return 2
    if args.share.of > 1:
        say(f"share {args.share} measured; once every share has finished, write the report with: python benchmarks/frontier.py --report-only"
            + (f" --n {args.n}" if args.n else "") + f" --store {args.store}")
        return 0
    if not tasks:
        say(f"error: {args.store} holds no sentence of any method measured whole; {args.out} is left as it was\n"
            "  hint: run this script without --report-only (with the same --store) first")
        return 2
    minutes = (time.perf_counter() - start) / 60
    asked = "full size" if args.n is None else f"--n {args.n}; full size is 500 on minilm-sentiment and 200 on smollm2-sentiment"
    head = [
        "# The faithfulness-cost frontier",
        "",
        f"Generated by `benchmarks/frontier.py` at **{'; '.join(sizes) or 'no sentence'}** ({asked}), "
        f"{'from the results store as it stood' if args.report_only else 'measuring what its stored explanations lacked' if args.measure_stored else 'computing what its results store lacked'}. "
        f"Every method at its defaults, explaining the predicted class; scored under protocol `{PROTOCOL}` with each removal operator "
        f"(`delete`, `[MASK]` (`[UNK]` without a mask token), `sample`: a movie-snippet word of the same spaCy part of speech), "
        f"soft comprehensiveness / sufficiency, and F-Fidelity (FFid+ / FFid-, beta = {FFID_BETA}, {args.samples} draws, "
        f"on the model's copy fine-tuned with random removal by its replacement operator, `[MASK]` or `[UNK]`), and counterfactual tests (Ye et al. 2021; cf. replace / cf. negate: the share of "
        "sentences where replacing the top word by a movie-snippet word of its spaCy tag, or putting `not` before the top adjective, lowers "
        "p(class) by 0.05 more than the same edit of a control word drawn per sentence; sentences without such an edit are left out). Intervals: 95 % percentile bootstrap over sentences; target comparisons: "
        "paired bootstrap of the per-sentence difference. Higher is better except sufficiency and FFid-. Cost: forward-pass "
        "equivalents per example the method ran (counted; a backward counts two), beside what its cost model predicts at these "
        "sentences' lengths; s / sentence: measured wall time of explaining on this machine under load, summed over the runs "
        "that stored the explanations.",
        "",
        roar_note(args.out.with_name("roar.md")),
        "",
        ceiling_note(args.out.with_name("aopc-ceiling.md")),
        "",
    ]
    tail = [
        "",
        command_line(),
        run_line(minutes, load_before, args.threads),
        f"- results store: `{args.store}` (`heedful bench dump` / `load` move it between machines)",
        f"- {library_versions('torch', 'transformers', 'spacy')}",
    ]
    write_results(args.out, "\n".join(head + sections + tail) + "\n")
    if tasks:
        args.front.write_text(json.dumps({"source": "docs/results/frontier.md (benchmarks/frontier.py)", "tasks": tasks}, indent=1) + "\n", encoding="utf-8")
    print("\n".join(line for line in sections if line.startswith("- ") or line.startswith("Pareto") or line.startswith("Sentences")))
    print(f"written to {args.out} and {args.front} in {minutes:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
