"""Mask-LRP reproduction report (Song et al. 2024, "Better Explain Transformers by Illuminating
Important Information"): the analogue of its Table 1, its AOPC / LOdds curves against the
corruption rate k (Figure 3), the deletion curve, the head map (Figure 5) and the random-mask
ablation (Table 1's "Random" row), on a zoo sentiment model.

Everything runs through :func:`heedful.evaluate.run_bench` with the ``mask-lrp`` protocol preset
(:mod:`heedful.evaluate.protocol`): gold label, tokens replaced by id 0 in descending score order,
``k = unique(round(linspace(0, 1, 10) * N))[1:]``, examples under 20 tokens skipped. Explanations
and measurements are kept in a results store (default ``heedful_home()/reproduce/mask-lrp``), so a
second run only computes what is missing.

The paper's QA metric, precision@20 on SQuAD (Table 2), has no QA data here; the report
computes it instead on the planted long contexts (:mod:`heedful.datasets.planted`) with a causal
LM, where the answer sentence is known by construction (:func:`_planted_run`).

Report options (``heedful reproduce mask-lrp -O key=value``): ``model`` (zoo name or folder),
``datasets`` (list of names or files), ``split``, ``methods`` (list; default :data:`METHODS`),
``head_mask`` (path of a mask saved by ``heedful heads``; default the model's cached mask),
``mask_seeds`` (random head masks), ``random_seeds`` (seeds of the random-score baseline),
``ig_steps`` (integrated-gradients steps), ``batch_size``. The planted section:
``planted_model`` (default ``smollm2-135m``; ``none`` leaves the section out), ``planted_n``
(documents; default :data:`PLANTED_N`), ``planted_length`` (prompt tokens; default
:data:`PLANTED_LENGTH`), ``planted_methods`` (default: ``methods`` but :data:`PLANTED_SKIPPED`); ``only=planted`` runs that
section alone and writes ``<out>/mask-lrp-planted.md`` (never the full report). ``dataset_n``
(``NAME:N,...``: examples per data set, default ``amazon:500``: every amazon test snippet of at least 20 tokens, 246), ``corruption_seeds``, ``extras``
(data sets that get the corruption curve and the threshold sweep; default the first, ``none``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from heedful.reproduce import ReportSettings
from heedful.reproduce.toolkit import LEGEND, all_of, difference_verdict, interval_text, spearman

NAME = "mask-lrp"
DEFAULT_N = 500
#: Fewer examples of the long product reviews (their curves cost about four times a movie
#: snippet's), so that the whole report computes in about an hour.
DEFAULT_DATASET_N = "amazon:500"
QUICK_N = 16
DEFAULT_MODEL = "minilm-sentiment"
DEFAULT_DATASETS = ("movies", "amazon")
METRICS = ("aopc", "log_odds", "deletion")
RANDOM_MASK = "mask_lrp (random mask)"

#: heedful method -> the row of the paper's Table 1 it stands for. The paper's "GAE" baseline is
#: Chefer et al. 2021a's relevance rollout (``generate_LRP`` in its code), heedful's ``chefer``;
#: its "Random" row is Mask-LRP with a random head mask of the same rate (:data:`RANDOM_MASK`).
PAPER_ROWS: dict[str, str] = {
    "raw_attention": "RawAtt",
    "rollout": "Rollout",
    "lrp": "LRP",
    "partial_lrp": "PartialLRP",
    "chefer": "GAE",
    "cam": "CAM",
    "attention_gradcam": "GradCAM",
    "attcat": "AttCAT",
    RANDOM_MASK: "Random",
    "mask_lrp": "Ours (Mask-LRP)",
}
#: Methods run besides the paper's (no published number).
EXTRA_METHODS = ("gae", "alti", "attnlrp", "grad_x_input", "integrated_gradients", "random")
METHODS = tuple(m for m in PAPER_ROWS if m != RANDOM_MASK) + EXTRA_METHODS
EXTRA_NOTES = {
    "gae": "Chefer et al. 2021b: gradient-weighted raw attention, no LRP",
    "alti": "Ferrando et al. 2022; the paper's Table 4 \"ALTC\"",
    "attnlrp": "Achtibat et al. 2024",
    "grad_x_input": "gradient x input",
    "integrated_gradients": "Sundararajan et al. 2017",
    "random": "random token scores, not the paper's Random row",
}

PLANTED_MODEL = "smollm2-135m"
PLANTED_N = 20
PLANTED_QUICK_N = 4
PLANTED_LENGTH = 512
PLANTED_METRICS = ("precision_at_k", "source_top1", "source_top3")
#: Methods left out of the planted section by default: ALTI's per-layer N x N x D decompositions
#: on 512-token prompts through 30 blocks would cost more than the rest of the report.
PLANTED_SKIPPED = ("alti",)
#: The paper's Table 2 (precision@20, %, SQuAD v1.1 / v2.0), the GPT-2 column: paper row -> value.
PAPER_TABLE2_GPT2: dict[str, tuple[float, float]] = {
    "Rollout": (5.86, 5.54), "RawAtt": (28.97, 27.85), "AttCAT": (17.53, 16.99), "Ours (Mask-LRP)": (51.62, 49.63),
}

#: The paper's Table 1 (BERT-base; AOPC up, LOdds down), single-sentence classification columns:
#: row -> dataset -> (AOPC, LOdds, AOPC std, LOdds std); std only for the random-mask row.
PAPER_TABLE1: dict[str, dict[str, tuple[float, float, float | None, float | None]]] = {
    "RawAtt": {"SST-2": (0.374, -0.992, None, None), "IMDB": (0.354, -1.593, None, None), "Yelp": (0.376, -1.513, None, None)},
    "Rollout": {"SST-2": (0.337, -0.911, None, None), "IMDB": (0.334, -1.456, None, None), "Yelp": (0.244, -0.770, None, None)},
    "LRP": {"SST-2": (0.336, -0.888, None, None), "IMDB": (0.288, -1.271, None, None), "Yelp": (0.163, -0.464, None, None)},
    "PartialLRP": {"SST-2": (0.396, -1.052, None, None), "IMDB": (0.370, -1.726, None, None), "Yelp": (0.401, -1.688, None, None)},
    "GAE": {"SST-2": (0.423, -1.171, None, None), "IMDB": (0.384, -1.853, None, None), "Yelp": (0.404, -1.682, None, None)},
    "CAM": {"SST-2": (0.399, -1.086, None, None), "IMDB": (0.365, -1.883, None, None), "Yelp": (0.298, -1.473, None, None)},
    "GradCAM": {"SST-2": (0.341, -0.855, None, None), "IMDB": (0.236, -0.974, None, None), "Yelp": (0.104, -0.229, None, None)},
    "AttCAT": {"SST-2": (0.405, -1.110, None, None), "IMDB": (0.340, -1.697, None, None), "Yelp": (0.397, -2.034, None, None)},
    "Random": {"SST-2": (0.432, -1.205, 0.005, 0.004), "IMDB": (0.387, -1.898, 0.004, 0.003), "Yelp": (0.426, -1.886, 0.005, 0.007)},
    "Ours (Mask-LRP)": {"SST-2": (0.438, -1.208, None, None), "IMDB": (0.392, -1.906, None, None), "Yelp": (0.434, -1.898, None, None)},
}
#: Our data set -> the paper's column it is set beside (by genre; the texts are not the same).
PAIRED = {"movies": "SST-2", "amazon": "Yelp", "tweets": "SST-2", "nyt": "SST-2"}
DATASET_NOTES = {
    "movies": "movie-review snippets (as SST-2: short movie-review sentences)",
    "amazon": "product-review snippets (set beside Yelp: reviews)",
    "tweets": "tweets (set beside SST-2: short single texts)",
    "nyt": "news snippets (set beside SST-2: short single texts)",
}


# ---------------------------------------------------------------------------- settings
@dataclasses.dataclass
class _Plan:
    model: str
    datasets: list[str]
    split: str
    n: int
    methods: list[str]
    mask_seeds: int
    random_seeds: int
    ig_steps: int
    batch_size: int
    head_mask: str | None
    store: Path
    quick: bool
    progress: bool
    planted_model: str | None = PLANTED_MODEL
    planted_n: int = PLANTED_N
    planted_length: int = PLANTED_LENGTH
    planted_methods: list[str] = dataclasses.field(default_factory=list)
    only: str | None = None
    dataset_n: dict[str, int] = dataclasses.field(default_factory=dict)
    corruption_seeds: int = 1
    extras: list[str] | None = None
    """Data sets that get the corruption curve and the threshold sweep (None: the first)."""

    def n_for(self, dataset: str) -> int:
        """Examples of ``dataset``: its ``dataset_n`` entry, else ``n``."""
        return self.dataset_n.get(dataset, self.n)


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def _count(opts: dict, key: str, default: int) -> int:
    """Option ``key`` as a positive whole number (``default`` when absent); an InputError otherwise."""
    from heedful.errors import InputError

    value = str(opts.get(key, default))
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"{key} must be a positive whole number, got {value!r}", hint=f"e.g. {key}={default}")
    return int(value)


def _plan(settings: ReportSettings) -> _Plan:
    from heedful.cache import heedful_home
    from heedful.errors import InputError

    opts = dict(settings.options)
    known = {"model", "datasets", "split", "methods", "mask_seeds", "random_seeds", "ig_steps", "batch_size", "head_mask",
             "planted_model", "planted_n", "planted_length", "planted_methods", "only", "dataset_n", "corruption_seeds",
             "extras"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise InputError(f"unknown mask-lrp report option {unknown[0]!r}", hint="options: " + ", ".join(sorted(known)))
    quick = settings.quick
    n = settings.n if settings.n is not None else (QUICK_N if quick else DEFAULT_N)
    if n < 1:
        raise InputError(f"n must be positive, got {n}")
    methods = _as_list(opts.get("methods", METHODS))
    if "mask_lrp" not in methods:
        methods.append("mask_lrp")
    only = None if opts.get("only") in (None, "") else str(opts["only"])
    if only not in (None, "planted"):
        raise InputError(f"unknown mask-lrp section {only!r}", hint="only=planted runs the planted precision@20 section alone")
    planted_model = str(opts.get("planted_model", PLANTED_MODEL))
    if planted_model.lower() in ("none", "") and only == "planted":
        raise InputError("only=planted needs a planted_model", hint=f"e.g. planted_model={PLANTED_MODEL}")
    planted_n = _count(opts, "planted_n", PLANTED_QUICK_N if quick else PLANTED_N)
    dataset_n = {}
    for item in _as_list(opts.get("dataset_n", DEFAULT_DATASET_N if not quick and settings.n is None else "")):
        name, _, count = item.rpartition(":")
        if not name or not count.isdigit() or int(count) < 1:
            raise InputError(f"bad dataset_n entry {item!r}", hint="dataset_n=NAME:N[,NAME:N], e.g. dataset_n=amazon:200")
        dataset_n[name] = int(count)
    datasets = _as_list(opts.get("datasets", DEFAULT_DATASETS))
    extras = None if "extras" not in opts else [d for d in _as_list(opts["extras"]) if d.lower() != "none"]
    strange = sorted(set(extras or []) - set(datasets))
    if strange:
        raise InputError(f"extras names {strange[0]!r}, which is not a data set of this run",
                         hint="extras=NAME[,NAME] from datasets=" + ",".join(datasets) + ", or extras=none")
    return _Plan(
        model=str(opts.get("model", DEFAULT_MODEL)),
        datasets=datasets,
        split=str(opts.get("split", "test")),
        n=n,
        methods=methods,
        mask_seeds=_count(opts, "mask_seeds", 2 if quick else 3),
        random_seeds=_count(opts, "random_seeds", 2),
        ig_steps=_count(opts, "ig_steps", 4 if quick else 16),
        batch_size=_count(opts, "batch_size", 16),
        head_mask=None if opts.get("head_mask") in (None, "") else str(opts["head_mask"]),
        store=Path(settings.store) if settings.store is not None else heedful_home() / "reproduce" / NAME,
        quick=quick,
        progress=settings.progress,
        planted_model=None if planted_model.lower() in ("none", "") else planted_model,
        planted_n=planted_n,
        planted_length=_count(opts, "planted_length", PLANTED_LENGTH),
        planted_methods=_as_list(opts["planted_methods"]) if "planted_methods" in opts else [m for m in methods if m not in PLANTED_SKIPPED],
        only=only,
        dataset_n=dataset_n,
        corruption_seeds=_count(opts, "corruption_seeds", 1),
        extras=extras,
    )


# ---------------------------------------------------------------------------- running
#: Labels of the Mask-LRP runs besides the main bench's ``mask_lrp`` (the literal variant, the
#: default, under the selected mask).
REFERENCE = "mask_lrp (reference)"
RANDOM_REFERENCE = "mask_lrp (reference, random mask)"
NO_POSITIONAL = "mask_lrp (w/o positional heads)"
NO_SYNTACTIC = "mask_lrp (w/o syntactic heads)"
#: Figure 4: shares of the unselected heads switched on (0 is the selected mask; 1, a mask of
#: ones, is ``chefer`` exactly in the literal variant -- tests/test_relevance_methods.py).
CORRUPTION_RATES = (0.1, 0.25, 0.5)
#: Eq. 7-8 thresholds tried besides the paper's (0.1, 0.8): (xi_synt, xi_pos).
THRESHOLD_SWEEP = ((0.0, 0.8), (0.0, 0.3))
#: Explanations compared on scores only (no perturbation curves): label -> (variant, fill).
FIXED_MASKS = {"no head kept": ("literal", 0), "no head kept (reference)": ("reference", 0)}


def _corrupted_label(rate: float) -> str:
    return f"mask_lrp (corrupted {rate:.0%})"


def _sweep_label(xi_synt: float, xi_pos: float) -> str:
    return f"mask_lrp (xi_synt {xi_synt:g}, xi_pos {xi_pos:g})"


@dataclasses.dataclass
class _Variant:
    """Mask-LRP under one head mask and variant, over one or more seeds (random or corrupted
    masks): the runs' store ``keys``, ``values`` (metric -> per-example values ``[n]``, the mean
    over seeds), ``seed_means`` (metric -> one mean per seed), ``curves`` (metric -> per-seed mean
    curves), the mean ``cost`` per example, and the mask's ``rate`` (mean over seeds)."""

    label: str
    keys: list[Any]
    values: dict[str, np.ndarray]
    seed_means: dict[str, list[float]]
    curves: dict[str, list[np.ndarray]]
    cost: dict[str, float]
    rate: float

    def mean(self, metric: str) -> float:
        return float(np.mean(self.seed_means[metric]))

    def std(self, metric: str) -> float | None:
        vals = self.seed_means[metric]
        return float(np.std(vals, ddof=1)) if len(vals) > 1 else None

    def curve(self, metric: str) -> tuple[np.ndarray, np.ndarray | None]:
        stack = np.stack(self.curves[metric])
        return np.nanmean(stack, axis=0), (np.nanstd(stack, axis=0, ddof=1) if len(stack) > 1 else None)


@dataclasses.dataclass
class _DatasetRun:
    """One data set: the main bench ``result`` (every method, ``mask_lrp`` = the literal variant
    under the selected mask), the example ``ids``, the other Mask-LRP runs by label
    (``variants``), per-example metric values of the main methods (``values``: method -> metric ->
    ``[n]``), the score ``sensitivity`` table and the wall seconds."""

    dataset: str
    result: Any  # BenchResult
    ids: list[str]
    variants: dict[str, _Variant]
    values: dict[str, dict[str, np.ndarray]]
    sensitivity: dict[str, dict[str, float]]
    seconds: float
    sweep_rates: dict[str, float] = dataclasses.field(default_factory=dict)
    zero_share: dict[str, float] = dataclasses.field(default_factory=dict)


def _spec(plan: _Plan, model, dataset: str, methods, options, protocol):
    from heedful.evaluate.bench import BenchSpec

    return BenchSpec(
        model=model,
        dataset=dataset,
        methods=list(methods),
        metrics=list(METRICS),
        protocol=protocol,
        out=plan.store,
        split=plan.split,
        n=plan.n_for(dataset),
        seed=0,
        batch_size=plan.batch_size,
        method_options=options,
    )


def _store_values(plan: _Plan, key, ids: list[str], phash: str) -> dict[str, np.ndarray]:
    """Per-example values ``[n]`` of every metric of :data:`METRICS` of one run, from the store."""
    from heedful.evaluate.bench import per_example_from_store
    from heedful.evaluate.store import ResultsStore

    with ResultsStore(plan.store) as store:
        return {m: np.asarray(per_example_from_store(store, key, m, phash, ids).values, dtype=float) for m in METRICS}


def _variant(plan: _Plan, model, dataset: str, label: str, option_sets: list[dict], masks: list, protocol, ids) -> _Variant:
    """Mask-LRP under each of ``option_sets`` (one per seed) through :func:`run_bench`; ``masks``:
    the head masks they amount to (for the rate)."""
    from heedful.evaluate.bench import run_bench

    keys, per_example, costs = [], [], []
    seed_means: dict[str, list[float]] = {m: [] for m in METRICS}
    curves: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
    for options in option_sets:
        got = run_bench(_spec(plan, model, dataset, ["mask_lrp"], {"mask_lrp": options}, protocol), progress=plan.progress)
        group = got.groups["mask_lrp"]
        for m in METRICS:
            seed_means[m].append(group.summaries[m].value)
            curves[m].append(np.asarray(group.summaries[m].curve, dtype=float))
        costs.append(group.cost)
        keys.append(got.runs[0].key)
        per_example.append(_store_values(plan, got.runs[0].key, ids, protocol.hash()))
    values = {m: np.nanmean([p[m] for p in per_example], axis=0) for m in METRICS}
    cost = {k: float(np.mean([c[k] for c in costs])) for k in ("seconds", "forward", "backward")}
    cost["peak_mb"] = max(c["peak_mb"] for c in costs)
    rate = float(np.mean([np.mean(m) for m in masks]))
    return _Variant(label, keys, values, seed_means, curves, cost, rate)


def _run_dataset(plan: _Plan, model, dataset: str, mask, protocol, first: bool) -> _DatasetRun:
    """Every run of one data set: the main bench, the reference variant, random masks of both
    variants, Table 3's masks, and -- on the ``first`` data set only -- the corruption curve and
    the threshold sweep; then the score sensitivity table."""
    from heedful.evaluate.bench import run_bench, select_inputs
    from heedful.lrp.masks import corrupted_mask, random_mask, without_positional, without_syntactic

    began = time.perf_counter()
    mask_list = mask.mask.astype(int).tolist()  # in the options, so that the store keys depend on the mask
    options = {"mask_lrp": {"head_mask": mask_list}, "integrated_gradients": {"n_steps": plan.ig_steps}}
    options = {m: o for m, o in options.items() if m in plan.methods}  # the bench refuses options of absent methods
    result = run_bench(_spec(plan, model, dataset, plan.methods, options, protocol), progress=plan.progress)
    ids = [i.id for i in select_inputs(model, result.spec, {})[0]]
    phash = protocol.hash()
    values = {r.group: _store_values(plan, r.key, ids, phash) for r in result.runs if r.group != "random"}
    seeds = list(range(plan.mask_seeds))
    randoms = [random_mask(mask, s).mask for s in seeds]

    def run(label, option_sets, masks):
        variants[label] = _variant(plan, model, dataset, label, option_sets, masks, protocol, ids)

    variants: dict[str, _Variant] = {}
    run(REFERENCE, [{"head_mask": mask_list, "variant": "reference"}], [mask.mask])
    run(RANDOM_MASK, [{"head_mask": mask_list, "ablation": "random", "ablation_seed": s} for s in seeds], randoms)
    run(RANDOM_REFERENCE, [{"head_mask": mask_list, "variant": "reference", "ablation": "random", "ablation_seed": s} for s in seeds], randoms)
    if mask.positional.any() or mask.syntactic.any():  # Table 3 needs the mask's breakdown
        for label, part in ((NO_POSITIONAL, without_positional(mask)), (NO_SYNTACTIC, without_syntactic(mask))):
            run(label, [{"head_mask": part.mask.astype(int).tolist()}], [part.mask])
    sweep_rates: dict[str, float] = {}
    if first:
        for rate in CORRUPTION_RATES:
            corrupt = range(plan.corruption_seeds)
            option_sets = [{"head_mask": mask_list, "ablation": "corrupted", "corruption_rate": rate, "ablation_seed": s} for s in corrupt]
            run(_corrupted_label(rate), option_sets, [corrupted_mask(mask, rate, s).mask for s in corrupt])
        for (xi_synt, xi_pos), swept in _swept_masks(mask).items():
            label = _sweep_label(xi_synt, xi_pos)
            sweep_rates[label] = swept.rate
            run(label, [{"head_mask": swept.mask.astype(int).tolist()}], [swept.mask])
    fixed = {label: _explain_only(plan, model, dataset, {"mask_lrp": {"head_mask": np.full(mask.shape, fill).tolist(), "variant": variant}}, protocol)
             for label, (variant, fill) in FIXED_MASKS.items()}
    keys = {r.group: r.key for r in result.runs if r.group != "random"}
    real, chefer = keys["mask_lrp"], keys.get("chefer")
    pairs = [("literal vs reference", real, variants[REFERENCE].keys[0])]
    if chefer is not None:
        pairs += [("literal vs chefer", real, chefer), ("reference vs chefer", variants[REFERENCE].keys[0], chefer)]
    pairs += [(f"literal: random mask (seed {s}) vs selected", real, k) for s, k in zip(seeds, variants[RANDOM_MASK].keys, strict=True)]
    pairs += [(f"reference: random mask (seed {s}) vs selected", variants[REFERENCE].keys[0], k)
              for s, k in zip(seeds, variants[RANDOM_REFERENCE].keys, strict=True)]
    if chefer is not None:
        pairs += [(f"{label} vs chefer", v.keys[0], chefer) for label, v in variants.items() if label.startswith("mask_lrp (xi_synt")]
    pairs += [("literal: no head kept vs selected", real, fixed["no head kept"]),
              ("reference: no head kept vs selected", variants[REFERENCE].keys[0], fixed["no head kept (reference)"])]
    sensitivity = _sensitivity(plan, model, result.spec, pairs)
    shown = {"mask_lrp": real, REFERENCE: variants[REFERENCE].keys[0], **({"chefer": chefer} if chefer is not None else {})}
    zeros = _zero_share(plan, ids, shown)
    return _DatasetRun(dataset, result, ids, variants, values, sensitivity, time.perf_counter() - began, sweep_rates, zeros)


def _zero_share(plan: _Plan, ids: list[str], keys: dict[str, Any]) -> dict[str, float]:
    """Per run: the mean share of an example's non-special tokens whose score is 0 (at most 1e-9
    of the example's largest score) -- tied at the bottom, removed in position order."""
    from heedful.evaluate.store import ResultsStore

    found = {}
    with ResultsStore(plan.store) as store:
        for label, key in keys.items():
            shares = []
            for expl in store.get_explanations(key, ids).values():
                scores = np.abs(np.asarray(expl.scores, float)[~np.asarray(expl.special, dtype=bool)])
                if scores.size:
                    shares.append(float(np.mean(scores <= 1e-9 * max(scores.max(), 1e-30))))
            found[label] = float(np.mean(shares)) if shares else float("nan")
    return found


def _swept_masks(mask) -> dict[tuple[float, float], Any]:
    """The masks of :data:`THRESHOLD_SWEEP`, selected from the statistics the mask was made from
    (none when it carries no statistics)."""
    from heedful.lrp.heads import HeadStatistics

    if mask.statistics is None:
        return {}
    stats = HeadStatistics.from_dict(mask.statistics, mask.meta)
    include_self = mask.meta.get("include_self", True)
    return {(a, b): stats.select(a, b, include_self) for a, b in THRESHOLD_SWEEP}


def _threshold_grid(mask) -> list[tuple[float, float, int, int, int]]:
    """``(xi_synt, xi_pos, kept, syntactic, positional)`` over a grid of thresholds (from the
    mask's statistics; empty without them)."""
    from heedful.lrp.heads import HeadStatistics

    if mask.statistics is None:
        return []
    stats = HeadStatistics.from_dict(mask.statistics, mask.meta)
    include_self = mask.meta.get("include_self", True)
    grid = []
    for a in (0.0, 0.05, 0.1):
        for b in (0.3, 0.5, 0.8):
            m = stats.select(a, b, include_self)
            grid.append((a, b, int(m.mask.sum()), int(m.syntactic.any(-1).sum()), int(m.positional.sum())))
    return grid


def _explain_only(plan: _Plan, model, dataset: str, options, protocol):
    """Store Mask-LRP explanations under ``options`` without measuring their curves (the
    sensitivity table compares scores only); returns their store key."""
    from heedful.evaluate import bench
    from heedful.evaluate.store import ResultsStore

    spec = _spec(plan, model, dataset, ["mask_lrp"], options, protocol)
    inputs, data = bench.select_inputs(model, spec, {})
    run = bench.make_runs(spec, bench.spec_subject(spec, data))[0]
    with ResultsStore(plan.store) as store:
        bench._explain_missing(model, store, run, inputs, spec)
    return run.key


def _sensitivity(plan: _Plan, model, spec, pairs: list[tuple[str, Any, Any]]) -> dict[str, dict[str, float]]:
    """How far the token scores of one run are from another's over the run's examples
    (non-special tokens): share of examples ranked in exactly the same order, mean Spearman rho,
    and the largest score difference relative to the example's largest score."""
    import warnings

    from scipy.stats import spearmanr

    from heedful.evaluate.bench import select_inputs
    from heedful.evaluate.store import ResultsStore

    ids = [i.id for i in select_inputs(model, spec, {})[0]]
    found: dict[str, dict[str, float]] = {}
    with ResultsStore(plan.store) as store:
        for label, ref_key, other_key in pairs:
            ref, other = store.get_explanations(ref_key, ids), store.get_explanations(other_key, ids)
            same, rhos, rel = [], [], []
            for i in ids:
                if i not in ref or i not in other:
                    continue
                keep = ~np.asarray(ref[i].special, dtype=bool)
                a, b = np.asarray(ref[i].scores, float)[keep], np.asarray(other[i].scores, float)[keep]
                if a.size < 2:
                    continue
                same.append(bool((np.argsort(-a, kind="stable") == np.argsort(-b, kind="stable")).all()))
                with warnings.catch_warnings():  # a constant score vector (no head kept) has no rank correlation
                    warnings.simplefilter("ignore")
                    rho = spearmanr(a, b).statistic
                rhos.append(float(rho) if np.isfinite(rho) else 1.0 if np.allclose(a, b) else 0.0)
                rel.append(float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)))
            found[label] = {
                "examples": len(same),
                "same_order": float(np.mean(same)) if same else float("nan"),
                "spearman": float(np.mean(rhos)) if rhos else float("nan"),
                "max_rel_diff": float(np.max(rel)) if rel else float("nan"),
            }
    return found


def _timings(plan: _Plan, runs: list[_DatasetRun] | None = None) -> dict[str, float]:
    """Longest wall time (seconds) any run of this report took per ``dataset|split|n``, kept in
    ``<store>/mask-lrp-times.json``: the run that computed the results, not a later one that read
    them back. ``runs`` are recorded first."""
    import json

    path = plan.store / f"{NAME}-times.json"
    try:
        times = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except json.JSONDecodeError:
        times = {}
    for run in runs or []:
        label = f"{run.dataset}|{plan.split}|{run.result.n_examples}"
        times[label] = max(float(times.get(label, 0.0)), run.seconds)
    if runs:
        path.write_text(json.dumps(times, indent=1, sort_keys=True), encoding="utf-8")
    return times


@dataclasses.dataclass
class _PlantedRun:
    """The planted precision@20 run: the bench result, ``ids`` of its documents, ``answered``
    ``[n]`` (the model's top next token is the planted answer), per-example ``values`` (method ->
    metric -> ``[n]``; the random baseline averaged over its seeds), the paper's-code ratio per
    method (mean hits / mean answer tokens), the mean answer and prompt tokens, the head mask's
    rate, and the wall seconds."""

    dataset: str
    result: Any
    ids: list[str]
    answered: np.ndarray
    values: dict[str, dict[str, np.ndarray]]
    code_ratio: dict[str, float]
    answer_tokens: float
    prompt_tokens: float
    example: tuple[str, str, str, int]
    mask_rate: float | None
    seconds: float
    mask: Any = None


def _planted_run(plan: _Plan) -> _PlantedRun:
    """Every planted method explains the planted answer token of ``plan.planted_n`` planted
    documents of at most ``plan.planted_length`` tokens (counted with the planted model's
    tokenizer) through :func:`heedful.evaluate.run_bench`; precision@20 and top-1 / top-3 source
    accuracy from the results store."""
    import warnings

    import heedful
    from heedful.evaluate.bench import BenchSpec, per_example_from_store, run_bench, select_inputs
    from heedful.evaluate.protocol import get_protocol
    from heedful.evaluate.store import ResultsStore

    began = time.perf_counter()
    model = heedful.load(plan.planted_model)
    methods = list(plan.planted_methods)
    options: dict[str, dict[str, Any]] = {}
    mask_rate = mask = None
    if "mask_lrp" in methods:
        from heedful.lrp.heads import default_head_mask

        mask = default_head_mask(model.adapter, limit=1000 if plan.quick else None)
        options["mask_lrp"] = {"head_mask": mask.mask.astype(int).tolist()}
        mask_rate = mask.rate
    if "integrated_gradients" in methods:
        options["integrated_gradients"] = {"n_steps": plan.ig_steps}
    protocol = dataclasses.replace(get_protocol("mask-lrp"), random_seeds=plan.random_seeds)
    spec = BenchSpec(
        model=model, dataset="planted", methods=methods, metrics=list(PLANTED_METRICS), protocol=protocol, out=plan.store,
        split="test", n=plan.planted_n, seed=0, batch_size=plan.batch_size, method_options=options,
        dataset_options={"length": plan.planted_length},
    )
    result = run_bench(spec, progress=plan.progress)
    inputs, data = select_inputs(model, spec, {})
    ids = [i.id for i in inputs]
    phash = protocol.hash()
    values: dict[str, dict[str, np.ndarray]] = {}
    code_ratio: dict[str, float] = {}
    with ResultsStore(plan.store) as store:
        first = next(r for r in result.runs if r.group != "random")
        explained = store.get_explanations(first.key, ids)
        answered = np.array([explained[i].prediction.get("index") == explained[i].target.indices[0] for i in ids])
        spans = [e.get("answer_tokens", np.nan) for e in per_example_from_store(store, first.key, "precision_at_k", phash, ids).extras or []]
        for group in result.groups:
            runs = [r for r in result.runs if r.group == group]
            values[group] = {}
            for metric in PLANTED_METRICS:
                per_seed = [per_example_from_store(store, r.key, metric, phash, ids) for r in runs]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    values[group][metric] = np.nanmean([p.values for p in per_seed], axis=0)
                if metric == "precision_at_k":
                    extras = [e for p in per_seed for e in (p.extras or []) if e]
                    hits = sum(e.get("hits", 0.0) for e in extras)
                    span = sum(e.get("answer_tokens", 0.0) for e in extras)
                    code_ratio[group] = hits / span if span else float("nan")
    ex = next(e for e in data if e.id == ids[0])
    _, a, b = ex.evidence_spans[0]
    question = ex.text[ex.meta["context"][1] :].strip()
    return _PlantedRun(
        f"planted-{plan.planted_length}", result, ids, answered, values, code_ratio, float(np.nanmean(spans)) if spans else float("nan"),
        float(np.mean([len(explained[i].tokens) for i in ids])), (ex.text[a:b], question, ex.target, len(ex.meta["distractors"])),
        mask_rate, time.perf_counter() - began, mask,
    )


def _planted_section(plan: _Plan, run: _PlantedRun) -> list[str]:
    """Markdown of the planted precision@20 run (see :func:`_planted_run`)."""
    from heedful.evaluate.intervals import bootstrap_mean
    from heedful.evaluate.report import overlapping

    result = run.result
    n, k = len(run.ids), result.spec.protocol.precision_k
    answered = int(run.answered.sum())
    times = _timings(plan, [run])
    computed = times.get(f"{run.dataset}|{plan.split}|{result.n_examples}", run.seconds)
    planted, question, target, distractors = run.example
    lines = [
        "## Token precision@20 on planted long contexts",
        "",
        f"The paper measures how well an explanation finds a QA answer with precision@20 on SQuAD (Table 2): of the "
        f"{k} highest-scored tokens, the share inside the gold answer. No QA data ships here, so the metric is computed "
        f"on planted long contexts, where the answer sentence is known by construction: `{result.model_name.rsplit('@', 1)[0]}` "
        f"reads {n} documents of at most {plan.planted_length} tokens (`heedful.datasets.load(\"planted\", \"test\", "
        f"n={n}, length={plan.planted_length}, tokenizer=model.tokenizer)`, {run.prompt_tokens:.0f} tokens on average): "
        "movie-review snippets of the test split, one per line, with one planted answer sentence "
        f"(e.g. \"{planted}\") and {distractors} distractor sentences of the same template about other subjects at seeded random places, "
        f"then a blank line and the question (\"{question}\"). Every method explains the planted answer as the next token "
        f"(\"{target}\"). Precision@{k}: of the {k} highest-scored non-special prompt tokens (the question's included), "
        f"the fraction inside the planted sentence — {run.answer_tokens:.1f} tokens on average, so at most "
        f"{min(1.0, run.answer_tokens / k):.2f}; a uniformly random ranking scores about {run.answer_tokens / run.prompt_tokens:.3f}.",
        "",
        f"The model's top next token is the planted answer for **{answered} of the {n} documents ({answered / n:.0%})**; "
        "the second column keeps only those (where the model demonstrably read the planted sentence). Intervals: 95 % "
        "percentile bootstrap over documents (1000 resamples); the random baseline's values are per-document means over "
        f"its {result.spec.protocol.random_seeds} seeds.",
        "",
        f"| method | paper row | precision@{k} [95% CI] | on answered documents [95% CI] | mean hits / mean answer tokens "
        "(the paper's code) | top-1 source [95% CI] | top-3 source [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    intervals: dict[str, dict[str, tuple[float, float, float]]] = {}
    for group in result.groups:
        vals = run.values[group]
        found = {
            "all": bootstrap_mean(vals["precision_at_k"][np.isfinite(vals["precision_at_k"])]),
            "answered": bootstrap_mean(vals["precision_at_k"][run.answered & np.isfinite(vals["precision_at_k"])]),
            "top1": bootstrap_mean(vals["source_top1"][np.isfinite(vals["source_top1"])]),
            "top3": bootstrap_mean(vals["source_top3"][np.isfinite(vals["source_top3"])]),
        }
        intervals[group] = found

        paper = PAPER_ROWS.get(group, "")
        name = f"**{group}**" if group == "mask_lrp" else group
        lines.append(
            f"| {name} | {paper} | {interval_text(*found['all'])} | {interval_text(*found['answered'])} | {_fmt(run.code_ratio.get(group))} | "
            f"{interval_text(*found['top1'])} | {interval_text(*found['top3'])} |"
        )
    best = max(intervals, key=lambda g: intervals[g]["all"][0] if math.isfinite(intervals[g]["all"][0]) else -math.inf)
    pairs = overlapping({g: (v["all"][1], v["all"][2]) for g, v in intervals.items()})
    with_best = [p for p in pairs if best in p.split(" / ")]
    lines += [
        "",
        f"Precision@{k} intervals that overlap (no difference claimed): {', '.join(pairs) or 'none'}.",
        "",
        f"Highest precision@{k}: `{best}`"
        + (f"; its interval overlaps those of {', '.join(p.replace(best, '').strip(' /') for p in with_best)}." if with_best
           else ", with an interval above every other method's."),
        "",
        "The paper's Table 2, GPT-2 column (precision@20 in %, SQuAD v1.1 / v2.0, explaining a fine-tuned span-prediction "
        "head; its code divides the mean number of hits by the mean answer length, which the fifth column above "
        "computes): "
        + ", ".join(f"{row} {a:.2f} / {b:.2f}" for row, (a, b) in PAPER_TABLE2_GPT2.items())
        + ". Only the ordering of methods can be set beside ours: other model, other task (a planted sentence copied by "
        "a next-token predictor, not a span head), other data.",
        "",
        f"- head mask of `{result.model_name.rsplit('@', 1)[0]}` for `mask_lrp`: "
        + (f"{run.mask_rate:.1%} mask rate, selected as above from the movie-review train split"
           + (" (its first 1,000 texts in a quick run)" if plan.quick else "") if run.mask_rate is not None else "not run")
        + (f"; integrated gradients with {plan.ig_steps} steps" if "integrated_gradients" in plan.planted_methods else ""),
        f"- run time: the run that completed the store for this setting computed for {computed / 60:.1f} min (wall clock, "
        "shared 2-core machine)",
        *([f"- not run on these prompts: {', '.join(f'`{m}`' for m in plan.methods if m not in plan.planted_methods)} "
           "(ALTI's per-layer N x N x D decompositions of 512-token prompts through 30 blocks would cost more than the rest "
           "of the report)"] if any(m not in plan.planted_methods for m in plan.methods) else []),
        "",
    ]
    return lines


def _load_mask(plan: _Plan, model):
    from heedful.lrp.heads import default_head_mask
    from heedful.lrp.masks import HeadMask

    if plan.head_mask is not None:
        return HeadMask.load(plan.head_mask)
    return default_head_mask(model.adapter)


# ---------------------------------------------------------------------------- numbers
def _ours(run: _DatasetRun, method: str, metric: str) -> tuple[float, float | None]:
    """(value, std over seeds or None) of one of our rows (a method or a Mask-LRP variant)."""
    if method in run.variants:
        return run.variants[method].mean(metric), run.variants[method].std(metric)
    group = run.result.groups.get(method)
    if group is None:
        return float("nan"), None
    summary = group.summaries[metric]
    return summary.value, (summary.std if group.seeds > 1 else None)


def _values(run: _DatasetRun, method: str, metric: str) -> np.ndarray | None:
    """Per-example values ``[n]`` of a method or variant (seeded ones: the mean over seeds)."""
    if method in run.variants:
        return run.variants[method].values[metric]
    return run.values.get(method, {}).get(metric)


def _interval(run: _DatasetRun, method: str, metric: str) -> tuple[float, float, float]:
    """Mean over the examples and its 95 % bootstrap interval (1000 resamples)."""
    from heedful.evaluate.intervals import bootstrap_mean

    vals = _values(run, method, metric)
    if vals is None:
        group = run.result.groups.get(method)
        if group is None:
            return (float("nan"),) * 3
        s = group.summaries[metric]
        return s.value, s.low, s.high
    return bootstrap_mean(vals[np.isfinite(vals)])


def _difference(run: _DatasetRun, a: str, b: str, metric: str) -> tuple[float, float, float]:
    """Mean per-example difference ``a - b`` and its 95 % paired bootstrap interval."""
    from heedful.evaluate.intervals import bootstrap_paired_difference

    va, vb = _values(run, a, metric), _values(run, b, metric)
    if va is None or vb is None:
        return (float("nan"),) * 3
    return bootstrap_paired_difference(va, vb)


def _excludes_zero(value: tuple[float, float, float]) -> bool:
    return math.isfinite(value[1]) and (value[1] > 0 or value[2] < 0)


def _standard_error(run: _DatasetRun, method: str, metric: str) -> float:
    """Standard error over examples of a method's mean metric."""
    summary = run.result.groups[method].summaries[metric]
    return summary.std / math.sqrt(summary.n) if summary.n else float("nan")


def _curve(run: _DatasetRun, method: str, metric: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    if method in run.variants:
        return run.variants[method].curve(metric)
    group = run.result.groups.get(method)
    if group is None or group.summaries[metric].curve is None:
        return None, None
    return np.asarray(group.summaries[metric].curve, dtype=float), group.curve_std.get(metric)


def _cost(run: _DatasetRun, method: str) -> dict[str, float]:
    if method in run.variants:
        return run.variants[method].cost
    return run.result.groups[method].cost


def _fmt(value: float | None, std: float | None = None, digits: int = 3) -> str:
    from heedful.evaluate.report import fmt

    return fmt(float("nan") if value is None else value, std, digits)


def _ranks(values: dict[str, float], higher_better: bool) -> dict[str, int]:
    """Competition ranks (1 = best); values equal to three decimals share a rank."""
    finite = {k: round(v if higher_better else -v, 3) for k, v in values.items() if math.isfinite(v)}
    return {k: 1 + sum(other > v for other in finite.values()) for k, v in finite.items()}


def _concordance(a: dict[str, float], b: dict[str, float]) -> tuple[int, int]:
    """Method pairs ordered the same way by ``a`` and ``b`` (ties count as disagreement), of all pairs."""
    keys = [k for k in a if k in b and math.isfinite(a[k]) and math.isfinite(b[k])]
    same = total = 0
    for i, p in enumerate(keys):
        for q in keys[i + 1 :]:
            total += 1
            same += (a[p] - a[q]) * (b[p] - b[q]) > 0
    return same, total


# ---------------------------------------------------------------------------- plots
def _style(method: str, k: int) -> tuple[Any, str, str]:
    """Colour, marker and line style of a method in the plots (distinct colours, by position)."""
    import matplotlib

    fixed = {
        "mask_lrp": ("red", "o", "-"),
        REFERENCE: ("#8b0000", "o", "--"),
        RANDOM_MASK: ("#333333", "s", "--"),
        RANDOM_REFERENCE: ("#777777", "s", ":"),
        "random": ("#999999", "x", ":"),
    }
    if method in fixed:
        return fixed[method]
    markers = "v^<>DPX*hp8d"
    palette = (0, 2, 4, 8, 10, 12, 14, 16, 18, 1, 3, 5, 9, 11, 13, 15, 17, 19)  # tab20 without the reds
    return matplotlib.colormaps["tab20"](palette[k % len(palette)]), markers[k % len(markers)], "-"


SEEDED = (RANDOM_MASK, RANDOM_REFERENCE)
"""Rows that are means over random head masks (their plots show +- one std over seeds)."""
VARIANT_ROWS = (REFERENCE, RANDOM_MASK, RANDOM_REFERENCE)
"""The Mask-LRP variants shown beside the methods in every table and plot."""
VARIANT_NAMES = {
    "mask_lrp": "Ours (Mask-LRP, Eq. 10 as written)",
    REFERENCE: "Ours, the authors' code",
    RANDOM_MASK: "Random mask (Eq. 10 as written)",
    RANDOM_REFERENCE: "Random mask, the authors' code",
}


def _label(method: str) -> str:
    if method in VARIANT_NAMES:
        return f"{VARIANT_NAMES[method]} [{method}]"
    return f"{PAPER_ROWS[method]} [{method}]" if method in PAPER_ROWS else method


def _plot_curves(run: _DatasetRun, methods: list[str], path: Path) -> Path:
    """AOPC and LOdds against k, one line per method (random-mask band: +- one std over seeds)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    x = 100 * np.asarray(run.result.x, dtype=float)
    fig, axes = plt.subplots(1, 2, figsize=(15, 6), facecolor="white")
    for ax, metric, ylabel in zip(axes, ("aopc", "log_odds"), ("AOPC (higher is better)", "LOdds (lower is better)"), strict=True):
        for k, method in enumerate(methods):
            curve, std = _curve(run, method, metric)
            if curve is None:
                continue
            color, marker, line = _style(method, k)
            width = 2.6 if method in ("mask_lrp", REFERENCE) else 1.4
            ax.plot(x[: len(curve)], curve, marker=marker, markersize=5, linestyle=line, linewidth=width, color=color, label=_label(method))
            if std is not None and method in SEEDED:
                ax.fill_between(x[: len(curve)], curve - std, curve + std, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel("k (% of tokens removed, specials counted)")
        ax.set_ylabel(ylabel)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{v:.0f}" for v in x])
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(f"{run.result.model_name.rsplit('@', 1)[0]} · {run.dataset} ({run.result.spec.split}, n={run.result.n_examples}) · protocol mask-lrp")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_deletion(runs: list[_DatasetRun], methods: list[str], path: Path) -> Path:
    """Mean gold-label probability as the top-k tokens are replaced (k = 0 is the intact input)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(1, len(runs), figsize=(7.5 * len(runs), 5.5), facecolor="white", squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        x = np.concatenate([[0.0], 100 * np.asarray(run.result.x, dtype=float)])
        for k, method in enumerate(methods):
            deletion, std = _curve(run, method, "deletion")
            aopc, _ = _curve(run, method, "aopc")
            if deletion is None or aopc is None:
                continue
            start = float(deletion[0] + aopc[0])  # p(gold | intact input), the same for every method
            curve = np.concatenate([[start], deletion])
            color, marker, line = _style(method, k)
            ax.plot(x[: len(curve)], curve, marker=marker, markersize=4, linestyle=line,
                    linewidth=2.6 if method in ("mask_lrp", REFERENCE) else 1.3, color=color, label=_label(method))
            if std is not None and method in SEEDED:
                ax.fill_between(x[1 : len(curve)], deletion - std, deletion + std, color=color, alpha=0.2, linewidth=0)
        ax.set_title(f"{run.dataset} (n={run.result.n_examples})")
        ax.set_xlabel("k (% of tokens replaced by [PAD])")
        ax.set_ylabel("mean p(gold label)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle("Deletion curves (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_ablation(runs: list[_DatasetRun], path: Path) -> Path:
    """Mean AOPC and LOdds of each random head mask (points, one per seed) against the selected
    mask (solid line) and all heads (``chefer``, dotted), per data set and variant, with the
    selected mask's 95 % bootstrap interval (shaded)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    cases = [(run, real, rand) for run in runs for real, rand in (("mask_lrp", RANDOM_MASK), (REFERENCE, RANDOM_REFERENCE))]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), facecolor="white")
    for ax, metric, ylabel in zip(axes, ("aopc", "log_odds"), ("mean AOPC (higher is better)", "mean LOdds (lower is better)"), strict=True):
        for i, (run, real, rand) in enumerate(cases):
            vals = run.variants[rand].seed_means[metric]
            jitter = np.linspace(-0.12, 0.12, len(vals)) if len(vals) > 1 else np.zeros(len(vals))
            ax.scatter(i + jitter, vals, color="#555555", s=28, zorder=3, label="random masks (one per seed)" if i == 0 else None)
            mean, low, high = _interval(run, real, metric)
            ax.fill_between([i - 0.3, i + 0.3], low, high, color="red", alpha=0.15, linewidth=0,
                            label="selected mask, 95% bootstrap interval" if i == 0 else None)
            ax.hlines(mean, i - 0.3, i + 0.3, color="red", linewidth=2.5, label="selected mask" if i == 0 else None)
            full, _ = _ours(run, "chefer", metric)
            if math.isfinite(full):
                ax.hlines(full, i - 0.3, i + 0.3, color="#1f77b4", linestyle=":", linewidth=2, label="all heads (chefer)" if i == 0 else None)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([f"{run.dataset}\n{'Eq. 10' if real == 'mask_lrp' else 'authors code'}" for run, real, _ in cases])
        ax.set_xlim(-0.6, len(cases) - 0.4)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("Mask-LRP: selected head mask vs random masks of the same size")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _corruption_points(run: _DatasetRun, metric: str) -> list[tuple[float, tuple[float, float, float]]]:
    """Figure 4: ``(rate, (mean, low, high))`` from the selected mask (0) through the corrupted
    masks to every head (1, ``chefer``); per-example values averaged over the seeds."""
    points = [(0.0, _interval(run, "mask_lrp", metric))]
    points += [(r, _interval(run, _corrupted_label(r), metric)) for r in CORRUPTION_RATES if _corrupted_label(r) in run.variants]
    if "chefer" in run.values:
        points.append((1.0, _interval(run, "chefer", metric)))
    return points


def _plot_corruption(run: _DatasetRun, path: Path) -> Path:
    """Figure 4: AOPC and LOdds against the corruption rate with 95 % bootstrap bands."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), facecolor="white")
    for ax, metric, ylabel in zip(axes, ("aopc", "log_odds"), ("mean AOPC (higher is better)", "mean LOdds (lower is better)"), strict=True):
        points = _corruption_points(run, metric)
        x = np.array([100 * r for r, _ in points])
        mean, low, high = (np.array([p[1][i] for p in points]) for i in range(3))
        ax.fill_between(x, low, high, color="#1f77b4", alpha=0.25, linewidth=0, label="95% bootstrap interval over examples")
        ax.plot(x, mean, color="#1f77b4", marker="o", linewidth=2, label="Mask-LRP (Eq. 10 as written), corrupted mask")
        ref = _interval(run, REFERENCE, metric)
        ax.axhline(ref[0], color="#8b0000", linestyle="--", linewidth=1.2, label="selected mask, the authors' code")
        ax.set_xlabel("corruption rate: % of the unselected heads switched on")
        ax.set_ylabel(ylabel)
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle(f"Mask-LRP against mask corruption (paper Figure 4; 100% = all heads = chefer) · {run.dataset} (n={run.result.n_examples})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------- markdown
def _mask_section(mask, image: str) -> list[str]:
    from heedful.lrp.masks import RELATIONS

    layers, heads = mask.shape
    kept = int(mask.mask.sum())
    meta = mask.meta
    lines = [
        "## Head mask (paper Sec. 4.2, Figure 5)",
        "",
        f"- model: {layers} blocks x {heads} heads = {mask.mask.size} heads; **kept {kept} ({mask.rate:.1%} mask rate)**: "
        f"{int(mask.syntactic.any(-1).sum())} syntactic, {int(mask.positional.sum())} positional",
        f"- selected from: {meta.get('dataset', '?')} {meta.get('split', '')} split"
        + (f", {mask.statistics['texts']} texts, {mask.statistics['queries']} query tokens" if mask.statistics else "")
        + f"; parser {meta.get('parser', '?')}; xi_synt {meta.get('xi_synt', '?')}, xi_pos {meta.get('xi_pos', '?')}, "
        f"offset 0 counted as a position: {meta.get('include_self', '?')}",
        "",
        f"![layer x head map of the kept heads]({image})",
        "",
    ]
    stats = mask.statistics
    rows = []
    for layer, head in zip(*np.nonzero(mask.mask), strict=True):
        why = []
        for k, rel in enumerate(RELATIONS):
            if mask.syntactic[layer, head, k]:
                detail = ""
                if stats:
                    acc = stats["syntactic_accuracy"][layer][head][k]
                    detail = f" (accuracy {acc:.3f} > threshold {stats['baseline'][rel]['threshold']:.3f})"
                why.append(f"syntactic: {rel}{detail}")
        if mask.positional[layer, head]:
            detail = ""
            if stats:
                off = stats["positional_top_offset"][layer][head]
                freq = stats["positional_top_frequency"][layer][head]
                detail = f" (offset {off:+d} holds the attention maximum for {freq:.1%} of queries)"
            why.append(f"positional{detail}")
        rows.append(f"| {layer} | {head} | {'; '.join(why) or 'kept (no breakdown saved)'} |")
    if rows:
        lines += ["| block | head | why kept |", "|---|---|---|", *rows, ""]
    if stats:
        lines += [
            "Eq. 7 thresholds (best fixed-offset baseline + xi_synt) and the heads' best syntactic accuracy:",
            "",
            "| relation | dependents | best offset | baseline | threshold | best head (accuracy) | heads above |",
            "|---|---|---|---|---|---|---|",
        ]
        acc = np.asarray(stats["syntactic_accuracy"], dtype=float)
        for k, rel in enumerate(RELATIONS):
            base = stats["baseline"][rel]
            best = np.unravel_index(int(np.argmax(acc[..., k])), acc.shape[:2])
            lines.append(
                f"| {rel} | {stats['relation_counts'][rel]} | {base['best_offset']:+d} | {base['accuracy']:.3f} | "
                f"{base['threshold']:.3f} | block {best[0]} head {best[1]} ({acc[best[0], best[1], k]:.3f}) | "
                f"{int(mask.syntactic[..., k].sum())} |"
            )
        lines.append("")
    upper = bool(kept) and int(np.nonzero(mask.mask)[0].max()) < layers / 2
    lines += [
        "The paper shows BERT-base's masks only as maps (Figure 5: positional heads in early blocks, syntactic heads in "
        "later ones, and few heads at all on the long-text data) and gives no mask rate."
        + (" Here every kept head sits in the lower half of the network; no head of the upper blocks passes either test."
           if upper else ""),
        "",
    ]
    return lines


def _dataset_table(run: _DatasetRun, methods: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Table 1 analogue of one data set, with the paired paper column, and what the orderings say.
    The paper's "Ours" and "Random" rows are the literal variant; the authors' code's variant is
    shown beside them, unranked."""
    paper_col = PAIRED.get(Path(run.dataset).stem)
    rows = [m for m in PAPER_ROWS if m == RANDOM_MASK or m in methods]
    ours = {m: {metric: _ours(run, m, metric) for metric in ("aopc", "log_odds")} for m in rows}
    paper = {m: PAPER_TABLE1[PAPER_ROWS[m]].get(paper_col) if paper_col else None for m in rows}
    ours_aopc = {m: ours[m]["aopc"][0] for m in rows}
    ours_lodds = {m: ours[m]["log_odds"][0] for m in rows}
    paper_aopc = {m: paper[m][0] for m in rows if paper[m]}
    paper_lodds = {m: paper[m][1] for m in rows if paper[m]}
    r_ours_a, r_ours_l = _ranks(ours_aopc, True), _ranks(ours_lodds, False)
    r_pap_a, r_pap_l = _ranks(paper_aopc, True), _ranks(paper_lodds, False)
    col = paper_col or "–"
    lines = [
        f"### {run.dataset} ({run.result.spec.split}, n = {run.result.n_examples}) beside the paper's {col}",
        "",
        f"| paper row [heedful method] | AOPC ↑ ours [95% CI] | LOdds ↓ ours [95% CI] | AOPC ↑ paper {col} | LOdds ↓ paper {col} | "
        "rank AOPC ours / paper | rank LOdds ours / paper |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(m: str, metric: str) -> str:
        value, std = _ours(run, m, metric)
        _, low, high = _interval(run, m, metric)
        return f"{_fmt(value, std)} [{_fmt(low)}, {_fmt(high)}]"

    for m in rows:
        p = paper[m]
        pa = _fmt(p[0], p[2]) if p else "–"
        pl = _fmt(p[1], p[3]) if p else "–"
        name = f"**{PAPER_ROWS[m]}** [`mask_lrp`, Eq. 10 as written]" if m == "mask_lrp" else (
            f"{PAPER_ROWS[m]} [`mask_lrp`, random heads, Eq. 10 as written]" if m == RANDOM_MASK else f"{PAPER_ROWS[m]} [`{m}`]"
        )
        lines.append(
            f"| {name} | {cell(m, 'aopc')} | {cell(m, 'log_odds')} | {pa} | {pl} | "
            f"{r_ours_a.get(m, '–')} / {r_pap_a.get(m, '–')} | {r_ours_l.get(m, '–')} / {r_pap_l.get(m, '–')} |"
        )
    for m, name in ((REFERENCE, "Ours, the authors' code [`mask_lrp`, `variant=\"reference\"`]"),
                    (RANDOM_REFERENCE, "Random, the authors' code [`mask_lrp`, `variant=\"reference\"`, random heads]")):
        if m in run.variants:
            lines.append(f"| {name} | {cell(m, 'aopc')} | {cell(m, 'log_odds')} | – | – | – | – |")
    for m in [m for m in methods if m not in PAPER_ROWS]:
        lines.append(f"| *not in the paper:* `{m}` ({EXTRA_NOTES.get(m, '')}) | {cell(m, 'aopc')} | {cell(m, 'log_odds')} | – | – | – | – |")
    lines += [
        "",
        "Intervals: 95 % percentile bootstrap over the examples (1000 resamples). Random masks: mean ± std over the "
        "seeds' means, the interval from the per-example means over the seeds; `random`: likewise over its seeds of "
        "random token scores. Ranks are among the paper's ten rows only (Ours and Random = Eq. 10 as written); values "
        "equal to three decimals share a rank.",
        "",
    ]
    found = {
        "paper_col": paper_col,
        "ours_aopc": ours_aopc,
        "ours_lodds": ours_lodds,
        "paper_aopc": paper_aopc,
        "paper_lodds": paper_lodds,
        "rank_ours_aopc": r_ours_a,
        "rank_ours_lodds": r_ours_l,
    }
    return lines, found


def _verdict(run: _DatasetRun, a: str, b: str) -> tuple[str, tuple, tuple]:
    """Whether ``a`` beats ``b`` on both metrics by the 95 % intervals of the paired differences."""
    da, dl = _difference(run, a, b, "aopc"), _difference(run, a, b, "log_odds")
    better = da[1] > 0 and dl[2] < 0
    worse = da[2] < 0 and dl[1] > 0
    if better:
        text = "better on both metrics (both intervals exclude 0)"
    elif worse:
        text = "worse on both metrics (both intervals exclude 0)"
    elif not _excludes_zero(da) and not _excludes_zero(dl):
        text = "no difference (both intervals include 0)"
    else:
        text = "mixed: " + ", ".join(
            f"{name} {'better' if (d[1] > 0 if name == 'AOPC' else d[2] < 0) else 'worse' if _excludes_zero(d) else 'no difference'}"
            for name, d in (("AOPC", da), ("LOdds", dl))
        )
    return text, da, dl


def _ordering_notes(run: _DatasetRun, found: dict[str, Any]) -> list[str]:
    """Where our ordering agrees with the paper's and where not, from the numbers."""
    col = found["paper_col"]
    oa, ol = found["ours_aopc"], found["ours_lodds"]
    pa, pl = found["paper_aopc"], found["paper_lodds"]
    lines = [f"**{run.dataset} vs the paper's {col}:**", ""]
    if not col:
        return lines + ["- no paper column to compare with.", ""]
    best_a = [PAPER_ROWS[m] for m, r in found["rank_ours_aopc"].items() if r == 1]
    best_l = [PAPER_ROWS[m] for m, r in found["rank_ours_lodds"].items() if r == 1]
    rank_a, rank_l = found["rank_ours_aopc"].get("mask_lrp"), found["rank_ours_lodds"].get("mask_lrp")
    paper_best_a = [PAPER_ROWS[m] for m, r in _ranks(pa, True).items() if r == 1]
    paper_best_l = [PAPER_ROWS[m] for m, r in _ranks(pl, False).items() if r == 1]
    paper_rank_a, paper_rank_l = _ranks(pa, True).get("mask_lrp"), _ranks(pl, False).get("mask_lrp")
    lines.append(
        f"- best of the paper's rows here: {' = '.join(best_a)} by AOPC, {' = '.join(best_l)} by LOdds (paper: "
        f"{' = '.join(paper_best_a)} by AOPC, {' = '.join(paper_best_l)} by LOdds); Mask-LRP ranks {rank_a} by AOPC "
        f"and {rank_l} by LOdds of {len(found['rank_ours_aopc'])} (paper: {paper_rank_a} and {paper_rank_l}) — "
        + ("**agrees**." if (rank_a, rank_l) == (paper_rank_a, paper_rank_l) else "**differs**.")
    )
    comparisons = [("mask_lrp", "chefer", "Mask-LRP minus GAE (all heads, `chefer`)"),
                   ("mask_lrp", RANDOM_MASK, "Mask-LRP minus the random-mask rollout"),
                   (REFERENCE, "chefer", "the authors' code minus GAE"),
                   (REFERENCE, RANDOM_REFERENCE, "the authors' code minus its random-mask rollout"),
                   ("mask_lrp", REFERENCE, "Eq. 10 as written minus the authors' code")]
    for a, b, label in comparisons:
        if _values(run, a, "aopc") is None or _values(run, b, "aopc") is None:
            continue
        text, da, dl = _verdict(run, a, b)
        paper = ""
        if a == "mask_lrp" and b in pa:
            paper = f" (paper: AOPC {pa['mask_lrp'] - pa[b]:+.3f}, LOdds {pl['mask_lrp'] - pl[b]:+.3f})"
        lines.append(f"- {label}, paired over the examples: AOPC {interval_text(*da, sign=True)}, LOdds {interval_text(*dl, sign=True)}{paper} — {text}.")
    rho_a, rho_l = spearman(oa, pa, minimum=3), spearman(ol, pl, minimum=3)
    ca, ta = _concordance(oa, pa)
    cl, tl = _concordance(ol, pl)
    lines.append(
        f"- rank agreement over the {len(oa)} rows: Spearman rho {rho_a:.2f} (AOPC), {rho_l:.2f} (LOdds); "
        f"method pairs ordered as in the paper: {ca}/{ta} (AOPC), {cl}/{tl} (LOdds)."
    )
    disagree = []
    for m in oa:
        if m not in pa:
            continue
        diff = found["rank_ours_aopc"].get(m, 0) - _ranks(pa, True).get(m, 0)
        if abs(diff) >= 3:
            disagree.append(f"{PAPER_ROWS[m]} ({'lower' if diff > 0 else 'higher'} here: rank {found['rank_ours_aopc'][m]} vs {_ranks(pa, True)[m]})")
    if disagree:
        lines.append("- largest rank moves (AOPC, 3 places or more): " + "; ".join(disagree) + ".")
    lines.append("")
    return lines


def _headline_section(runs: list[_DatasetRun], methods: list[str]) -> list[str]:
    """Every method and Mask-LRP variant ordered by its mean, with 95 % bootstrap intervals, and
    whether the intervals of neighbours in that order overlap."""
    lines = [
        "## Headline ordering with 95 % bootstrap intervals",
        "",
        "Methods ordered by their mean over the examples, best first; an interval that overlaps the next method's "
        "means the two are not told apart at this n (unpaired intervals; the paired differences above are sharper).",
        "",
    ]
    rows = [*methods, *VARIANT_ROWS]
    for run in runs:
        for metric, title, better_high in (("aopc", "AOPC ↑", True), ("log_odds", "LOdds ↓", False)):
            found = {m: _interval(run, m, metric) for m in rows}
            order = sorted((m for m in rows if math.isfinite(found[m][0])), key=lambda m: found[m][0], reverse=better_high)
            lines += [f"**{run.dataset}, {title}** (n = {run.result.n_examples}):", "",
                      "| rank | method | mean [95% CI] | overlaps the next |", "|---|---|---|---|"]
            overlaps = []
            for i, m in enumerate(order):
                nxt = order[i + 1] if i + 1 < len(order) else None
                over = nxt is not None and found[m][1] <= found[nxt][2] and found[nxt][1] <= found[m][2]
                if over:
                    overlaps.append(f"{m} / {nxt}")
                name = f"**{m}**" if m == "mask_lrp" else m
                lines.append(f"| {i + 1} | {name} | {interval_text(*found[m])} | {'yes' if over else 'no' if nxt else '–'} |")
            lines += ["", "Adjacent pairs whose intervals overlap: " + (", ".join(overlaps) or "none") + ".", ""]
    return lines


def _curve_tables(run: _DatasetRun, methods: list[str]) -> list[str]:
    x = [f"{100 * v:.0f}%" for v in run.result.x]
    lines = []
    for metric, title in (("aopc", "AOPC"), ("log_odds", "LOdds")):
        lines += [f"{title} per k on {run.dataset}:", "", "| method | " + " | ".join(x) + " | mean |", "|" + "---|" * (len(x) + 2)]
        for m in methods:
            curve, _ = _curve(run, m, metric)
            if curve is None:
                continue
            value, _ = _ours(run, m, metric)
            cells = " | ".join(_fmt(v) for v in curve)
            lines.append(f"| {'**mask_lrp**' if m == 'mask_lrp' else m} | {cells} | {_fmt(value)} |")
        lines.append("")
    return lines


def _sensitivity_rows(runs: list[_DatasetRun]) -> list[str]:
    lines = [
        "| data | explanations compared | examples | same removal order | mean Spearman rho | largest score change (relative) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        for label, sens in run.sensitivity.items():
            lines.append(
                f"| {run.dataset} | {label} | {sens['examples']} | {sens['same_order']:.1%} | {sens['spearman']:.4f} | "
                f"{sens['max_rel_diff']:.2e} |"
            )
    return [*lines, ""]


def _ablation_section(runs: list[_DatasetRun], mask, image: str) -> list[str]:
    kept = int(mask.mask.sum())
    total = mask.mask.size
    seeds = len(runs[0].variants[RANDOM_MASK].keys)
    lines = [
        "## Ablation: random head masks of the same rate (paper Table 1 \"Random\", Sec. 5.4)",
        "",
        f"Mask-LRP with {kept} heads drawn at random from the {total} (`ablation=\"random\"`, seeds 0..{seeds - 1}), "
        "in both variants, against the selected mask and against all heads (`chefer`). A random mask shares on "
        f"average {kept * kept / total:.2f} heads with the selected one. Differences are paired over the examples "
        "(per-example values of the random masks averaged over the seeds), with 95 % bootstrap intervals.",
        "",
        f"![random masks vs the selected mask]({image})",
        "",
        "| data | variant | metric | selected mask [95% CI] | random masks: mean ± std over seeds (per seed) | all heads (`chefer`) | "
        "selected − random [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for run in runs:
        for real, rand, name in (("mask_lrp", RANDOM_MASK, "Eq. 10 as written"), (REFERENCE, RANDOM_REFERENCE, "the authors' code")):
            for metric, label in (("aopc", "AOPC ↑"), ("log_odds", "LOdds ↓")):
                v = run.variants[rand]
                per = ", ".join(f"{x:.4f}" for x in v.seed_means[metric])
                diff = _difference(run, real, rand, metric)
                lines.append(
                    f"| {run.dataset} | {name} | {label} | {interval_text(*_interval(run, real, metric), 4)} | "
                    f"{_fmt(v.mean(metric), v.std(metric), digits=4)} ({per}) | {_fmt(_ours(run, 'chefer', metric)[0], digits=4)} | "
                    f"{interval_text(*diff, 4, sign=True)} |"
                )
            verdicts.append(f"{run.dataset}, {name}: selected vs random masks — {_verdict(run, real, rand)[0]}")
    lines += ["", *[f"- {v}." for v in verdicts], ""]
    lines += [
        "How much the head mask and the variant move the token scores: explanations compared example by example, "
        "non-special tokens; \"same removal order\": the protocol removes the tokens in exactly the same order. "
        "\"no head kept\" is a mask of zeros (explanations only, no curves): in Eq. 10 as written every layer's map is "
        "then 0, the rollout is the identity and every score 0.",
        "",
        *_sensitivity_rows(runs),
    ]
    return lines


def _corruption_section(run: _DatasetRun, image: str) -> list[str]:
    """Figure 4 analogue: the corrupted masks' AOPC / LOdds against the rate, with the trend."""
    seeds = len(next(v for k, v in run.variants.items() if k.startswith("mask_lrp (corrupted")).keys)
    lines = [
        "## Mask corruption (paper Figure 4)",
        "",
        "The paper: \"we randomly switched a portion of the remaining zeros in M_ours ... If our method employs a 100% "
        "corrupted mask (a mask filled with ones), it degenerates to GAE\" — i.e. a share of the *unselected* heads is "
        "switched on, the selected heads stay. heedful's `ablation=\"corrupted\"` (`heedful.lrp.masks.corrupted_mask`) is "
        "exactly that (the kept heads are not replaced by random ones; that is the `random` ablation above). Rates "
        f"{', '.join(f'{r:.0%}' for r in CORRUPTION_RATES)} with {seeds} seed{'s' if seeds > 1 else ''} each (per-example "
        "values averaged over the seeds); 0 % is the selected mask, 100 % a mask of ones, which in Eq. 10 as written *is* `chefer` (tested to "
        f"1e-5), so its point is `chefer`'s run. {run.dataset}, n = {run.result.n_examples}; bands: 95 % bootstrap "
        "intervals over the examples.",
        "",
        f"![mask corruption]({image})",
        "",
        "| corruption rate | heads kept (mean) | AOPC ↑ [95% CI] | LOdds ↓ [95% CI] |",
        "|---|---|---|---|",
    ]
    for (rate, a), (_, lo) in zip(_corruption_points(run, "aopc"), _corruption_points(run, "log_odds"), strict=True):
        heads = 1.0 if rate == 1.0 else run.variants[_corrupted_label(rate) if rate else REFERENCE].rate
        lines.append(f"| {rate:.0%} | {heads:.1%} | {interval_text(*a)} | {interval_text(*lo)} |")
    rho_a, rho_l = _corruption_trend(run)
    ends = _verdict(run, "mask_lrp", "chefer")
    lines += [
        "",
        f"Trend over the rates: Spearman rho of the mean against the rate {rho_a:+.2f} (AOPC; the paper: falling, "
        f"i.e. negative) and {rho_l:+.2f} (LOdds; the paper: rising). Selected mask (0 %) minus all heads (100 %), paired: "
        f"AOPC {interval_text(*ends[1], sign=True)}, LOdds {interval_text(*ends[2], sign=True)} — {ends[0]}.",
        "",
    ]
    return lines


def _corruption_trend(run: _DatasetRun) -> tuple[float, float]:
    """Spearman rho of the mean AOPC and of the mean LOdds against the corruption rate."""
    from scipy.stats import spearmanr

    rates = [r for r, _ in _corruption_points(run, "aopc")]
    return tuple(float(spearmanr(rates, [v[0] for _, v in _corruption_points(run, m)]).statistic) for m in ("aopc", "log_odds"))


def _layers_of(mask) -> str:
    """Per block with kept heads: ``block: kept (syntactic / positional)``."""
    parts = []
    for layer in range(mask.shape[0]):
        kept = int(mask.mask[layer].sum())
        if kept:
            synt, pos = int(mask.syntactic[layer].any(-1).sum()), int(mask.positional[layer].sum())
            parts.append(f"{layer}: {kept} ({synt} synt, {pos} pos)")
    return "; ".join(parts) or "none"


def _why_section(runs: list[_DatasetRun], mask, planted: _PlantedRun | None, conservation: dict[str, dict[str, float]]) -> list[str]:
    """Evidence on how much the mask matters in either variant: mask rate and where its heads sit
    (MiniLM and the planted model), relevance conservation, a threshold sweep and the rank
    correlation of each variant with `chefer`."""
    first = runs[0]
    layers, heads = mask.shape
    empty = [layer for layer in range(layers) if not mask.mask[layer].any()]
    lines = [
        "## Why the mask matters as much as it does: heads, thresholds, conservation",
        "",
        f"**Which heads pass.** `{first.result.model_name.rsplit('@', 1)[0]}` ({layers} blocks x {heads} heads): "
        f"{int(mask.mask.sum())} kept ({mask.rate:.1%}); per block — {_layers_of(mask)}; blocks with no kept head: "
        f"{', '.join(map(str, empty)) or 'none'}.",
    ]
    if planted is not None and planted.mask is not None:
        pm = planted.mask
        pempty = sum(1 for layer in range(pm.shape[0]) if not pm.mask[layer].any())
        lines[-1] += (
            f" For comparison, `{planted.result.model_name.rsplit('@', 1)[0]}` ({pm.shape[0]} blocks x {pm.shape[1]} heads, "
            "the zoo's only deeper model; no 12-layer encoder is available here), selected the same way from the same "
            f"movie-review train split: {int(pm.mask.sum())} kept ({pm.rate:.1%}); per block — {_layers_of(pm)}; "
            f"{pempty} of {pm.shape[0]} blocks keep no head."
        )
    lines += [
        "",
        "In Eq. 10 as written a block without kept heads contributes Abar = 0, i.e. the identity, to the rollout (Eq. 11), "
        "so the explanation is the rollout of the kept heads' maps alone; in the authors' code every block still "
        "contributes the map of its *unmasked* relevance, averaged over all heads, and the mask only shrinks the "
        "relevance that reaches the lower blocks.",
        "",
    ]
    if conservation:
        lines += [
            f"**Conservation.** Relevance summed at each block's input, one-hot seed 1, first {int(next(iter(conservation.values()))['examples'])} "
            f"{first.dataset} examples under the selected mask (`heedful.lrp.propagate(..., blocks=True)`):",
            "",
            "| variant | sum at the first block's input (mean) | largest per-block change of the sum | mean sum at each block's input, "
            "block 0 … last, then the last block's output |",
            "|---|---|---|---|",
        ]
        for variant, found in conservation.items():
            blocks = ", ".join(f"{v:.4f}" for v in found["blocks"])
            lines.append(f"| {variant} | {found['input']:.6f} | {found['worst']:.2e} | {blocks} |")
        lines += [
            "",
            "The authors' code cuts heads after the residual split, so what the cut heads received is lost; with "
            "renormalisation each block passes on all of it (test: `tests/test_relevance_rules.py::"
            "test_literal_mask_lrp_conserves_relevance_through_every_block`, tolerance 1e-5).",
            "",
        ]
    grid = _threshold_grid(mask)
    if grid:
        lines += [
            "**Thresholds (Eq. 7-8).** Heads kept for other xi_synt / xi_pos (from the same head statistics):",
            "",
            "| xi_synt | xi_pos | heads kept | syntactic | positional |",
            "|---|---|---|---|---|",
            *[f"| {a:g} | {b:g} | {k} | {s} | {p} |" for a, b, k, s, p in grid],
            "",
        ]
    sweep = [label for label in first.variants if label.startswith("mask_lrp (xi_synt")]
    if sweep:
        lines += [
            f"Mask-LRP (Eq. 10 as written) under some of them, {first.dataset} (n = {first.result.n_examples}), against the "
            "paper's thresholds (0.1, 0.8) and `chefer`:",
            "",
            "| thresholds | mask rate | AOPC ↑ [95% CI] | LOdds ↓ [95% CI] | minus the paper's thresholds: AOPC [95% CI] | "
            "Spearman rho with `chefer` |",
            "|---|---|---|---|---|---|",
            f"| xi_synt 0.1, xi_pos 0.8 (paper) | {mask.rate:.1%} | {interval_text(*_interval(first, 'mask_lrp', 'aopc'))} | "
            f"{interval_text(*_interval(first, 'mask_lrp', 'log_odds'))} | – | {first.sensitivity.get('literal vs chefer', {}).get('spearman', float('nan')):.3f} |",
        ]
        for label in sweep:
            rho = first.sensitivity.get(f"{label} vs chefer", {}).get("spearman", float("nan"))
            lines.append(
                f"| {label[len('mask_lrp ('):-1]} | {first.sweep_rates.get(label, float('nan')):.1%} | "
                f"{interval_text(*_interval(first, label, 'aopc'))} | {interval_text(*_interval(first, label, 'log_odds'))} | "
                f"{interval_text(*_difference(first, label, 'mask_lrp', 'aopc'), sign=True)} | {rho:.3f} |"
            )
        lines.append("")
    lines += ["**Rank correlation with `chefer` per variant** (mean Spearman rho over the examples) and the share of "
              "tokens scored 0 (tied at the bottom of the removal order, removed in position order):", ""]
    for run in runs:
        s = run.sensitivity
        lines.append(
            f"- {run.dataset}: Eq. 10 as written {s.get('literal vs chefer', {}).get('spearman', float('nan')):.3f}, "
            f"the authors' code {s.get('reference vs chefer', {}).get('spearman', float('nan')):.3f}; between the two "
            f"variants {s['literal vs reference']['spearman']:.3f}; tokens scored 0: "
            + ", ".join(f"{label} {share:.1%}" for label, share in run.zero_share.items()) + "."
        )
    lines += ["", *_reading(runs, mask, conservation)]
    return lines


def _reading(runs: list[_DatasetRun], mask, conservation: dict[str, dict[str, float]]) -> list[str]:
    """What the numbers above say about each variant, in words chosen by the numbers."""
    first = runs[0]
    rho_lit = [r.sensitivity.get("literal vs chefer", {}).get("spearman", float("nan")) for r in runs]
    rho_ref = [r.sensitivity.get("reference vs chefer", {}).get("spearman", float("nan")) for r in runs]
    empty_ref = [r.sensitivity.get("reference: no head kept vs selected", {}).get("same_order", float("nan")) for r in runs]
    rand_ref = [v["same_order"] for r in runs for k, v in r.sensitivity.items() if k.startswith("reference: random mask")]
    layers = mask.shape[0]
    empty = sum(1 for layer in range(layers) if not mask.mask[layer].any())
    text = []
    lit = (
        f"**Reading.** In Eq. 10 as written the mask decides the explanation: with {int(mask.mask.sum())} heads kept and "
        f"{empty} of {layers} blocks without any, the rollout is the product of the kept heads' maps alone, and its token "
        f"ranking is unrelated to `chefer`'s (mean Spearman rho {', '.join(f'{v:.2f}' for v in rho_lit)})"
    )
    if "mask_lrp" in first.zero_share:
        lit += f"; it scores {first.zero_share['mask_lrp']:.0%} of the {first.dataset} tokens exactly 0"
    if any(k.startswith("mask_lrp (corrupted") for k in first.variants) and "chefer" in first.values:
        rho_a, _ = _corruption_trend(first)
        lit += (
            f". Switching unselected heads back on moves it towards `chefer` (AOPC against the corruption rate: Spearman "
            f"rho {rho_a:+.2f})"
        )
    text.append(lit + ".")
    ref = (
        f"In the authors' code the mask hardly matters: its ranking stays close to `chefer`'s (rho "
        f"{', '.join(f'{v:.2f}' for v in rho_ref)}), a mask keeping no head ranks the tokens as the selected mask does in "
        f"{', '.join(f'{v:.0%}' for v in empty_ref)} of the examples, and random masks in at least "
        f"{min(rand_ref):.0%}" if rand_ref else "In the authors' code the mask hardly matters"
    )
    if conservation:
        lost = conservation["the authors' code"]["input"]
        ref += (
            f". The cut heads' relevance is lost (the sum reaching the input is {lost:.3f} of 1), so the relevance and thus the maps of every block below "
            "the top shrink, whichever heads are kept; in Eq. 11 each map is added to the identity and rows are "
            "normalised, so shrunken maps leave nearly the identity, and the explanation is dominated by the upper "
            "blocks' maps -- which are `chefer`'s own maps (doubled), as the maps of the unmasked relevance"
        )
    text.append(ref + ".")
    return [" ".join(text), ""]


def _conservation(model, dataset: str, split: str, mask, n: int = 32) -> dict[str, dict[str, float]]:
    """Relevance at every block's input under ``mask`` in both variants, first ``n`` texts of the
    split that are 20 tokens or longer: mean sum at the first block's input and the largest
    per-block change of the sum (one-hot seed)."""
    import torch

    from heedful import datasets
    from heedful.lrp import CheferRules, propagate

    tok = model.adapter.tokenizer
    texts = [e.text for e in datasets.load(dataset, split, None) if len(tok(e.text)["input_ids"]) >= 20][:n]
    if not texts:
        return {}
    problem = model.prepare(texts)
    found = {}
    for variant in ("literal", "reference"):
        got = propagate(model.adapter, problem.batch, problem.target, CheferRules(), blocks=True,
                        head_mask=torch.as_tensor(mask.as_float()), mask_variant=variant, inputs=False)
        sums = torch.stack([r.sum(dim=(1, 2)) for r in got.blocks], dim=1).double()
        found["Eq. 10 as written" if variant == "literal" else "the authors' code"] = {
            "examples": float(len(texts)),
            "input": float(sums[:, 0].mean()),
            "worst": float((sums[:, 1:] - sums[:, :-1]).abs().max()),
            "blocks": [float(v) for v in sums.mean(dim=0)],
        }
    return found


def _claims_section(runs: list[_DatasetRun], mask, planted: _PlantedRun | None, conservation: dict[str, dict[str, float]]) -> list[str]:
    """Every claim of the paper against this run: holds / does not hold / cannot be tested here,
    with the number behind the verdict (all computed above in this run)."""
    rows: list[tuple[str, str, str]] = []

    def per_dataset(fn) -> tuple[str, str]:
        verdicts, numbers = zip(*(fn(run) for run in runs), strict=True)
        verdict = verdicts[0] if len(set(verdicts)) == 1 else "mixed (" + "; ".join(f"{r.dataset}: {v}" for r, v in zip(runs, verdicts, strict=True)) + ")"
        return verdict, "; ".join(f"{r.dataset}: {n}" for r, n in zip(runs, numbers, strict=True))

    def best(run: _DatasetRun, metric: str, higher: bool):
        paper = [m for m in PAPER_ROWS if m not in (RANDOM_MASK,) and (m in run.values)]
        vals = {m: _ours(run, m, metric)[0] for m in paper}
        order = sorted(vals, key=vals.get, reverse=higher)
        rank = order.index("mask_lrp") + 1
        runner = order[1] if order[0] == "mask_lrp" else order[0]
        d = _difference(run, "mask_lrp", runner, metric)
        return str(difference_verdict(d, higher)), f"rank {rank} of {len(order)}; Mask-LRP − {runner} {interval_text(*d, sign=True)}"

    rows.append(("Mask-LRP has the highest AOPC of the paper's methods (Table 1)", *per_dataset(lambda r: best(r, "aopc", True))))
    rows.append(("Mask-LRP has the lowest LOdds of the paper's methods (Table 1)", *per_dataset(lambda r: best(r, "log_odds", False))))

    def improvement(run: _DatasetRun):
        base = [m for m in PAPER_ROWS if m not in (RANDOM_MASK, "mask_lrp") and m in run.values]
        found = []
        ok = True
        for metric, higher in (("aopc", True), ("log_odds", False)):
            vals = {m: _ours(run, m, metric)[0] for m in base}
            top = max(vals, key=vals.get) if higher else min(vals, key=vals.get)
            ours = _ours(run, "mask_lrp", metric)[0]
            rel = (ours - vals[top]) / abs(vals[top]) * (1 if higher else -1)
            ok &= rel >= 0.0356
            found.append(f"{metric.replace('log_odds', 'LOdds').replace('aopc', 'AOPC')} {rel:+.1%} vs {top}")
        return ("holds" if ok else "does not hold"), ", ".join(found)

    rows.append(("≥ 3.56 % better AOPC and LOdds than the best baseline (abstract, contribution 3)", *per_dataset(improvement)))

    def beats(a: str, b: str):
        def fn(run: _DatasetRun):
            _, da, dl = _verdict(run, a, b)
            return str(all_of([difference_verdict(da, True), difference_verdict(dl, False)])), f"AOPC {interval_text(*da, sign=True)}, LOdds {interval_text(*dl, sign=True)}"
        return fn

    rows.append(("The selected heads beat random heads of the same rate (Table 1 \"Random\", Sec. 5.4 Q1)", *per_dataset(beats("mask_lrp", RANDOM_MASK))))
    rows.append(("… the same in the authors' code's form (variant=\"reference\")", *per_dataset(beats(REFERENCE, RANDOM_REFERENCE))))
    rows.append(("Cutting irrelevant heads improves on the unmasked rollout GAE (contribution 2; Table 1 Ours vs GAE)", *per_dataset(beats("mask_lrp", "chefer"))))
    rows.append(("Even a random mask beats GAE (Sec. 5.4 Q2)", *per_dataset(beats(RANDOM_MASK, "chefer"))))
    first = runs[0]
    if any(k.startswith("mask_lrp (corrupted") for k in first.variants):
        rho_a, rho_l = _corruption_trend(first)
        text, da, _ = _verdict(first, "mask_lrp", "chefer")
        ok = rho_a < 0 and rho_l > 0 and text.startswith("better on both")
        rows.append((
            "Explanations degrade as the mask is corrupted and converge to GAE (Figure 4)",
            "holds" if ok else "does not hold",
            f"{first.dataset}: Spearman rho of mean against rate AOPC {rho_a:+.2f}, LOdds {rho_l:+.2f}; 0 % − 100 % AOPC {interval_text(*da, sign=True)}",
        ))
    if NO_POSITIONAL in first.variants:
        def table3(run: _DatasetRun):
            parts, ok = [], True
            for label, name in ((NO_POSITIONAL, "w/o M_pos"), (NO_SYNTACTIC, "w/o M_synt")):
                if label not in run.variants:
                    continue
                d = _difference(run, label, "mask_lrp", "aopc")
                ok &= not _excludes_zero(d)
                parts.append(f"{name} − full AOPC {interval_text(*d, sign=True)}")
            return ("holds" if ok else "does not hold"), ", ".join(parts)

        rows.append(("Dropping either mask type barely changes the result (Table 3)", *per_dataset(table3)))
    if "alti" in first.values:
        rows.append(("Mask-LRP beats ALTC/ALTI (Table 4)", *per_dataset(beats("mask_lrp", "alti"))))
    else:
        rows.append(("Mask-LRP beats ALTC/ALTI (Table 4)", "cannot be tested here", "`alti` not in this run's methods"))

    def depth(m) -> tuple[float, float]:
        pos = np.nonzero(m.positional)[0]
        synt = np.nonzero(m.syntactic.any(-1))[0]
        return (float(pos.mean()) if pos.size else float("nan"), float(synt.mean()) if synt.size else float("nan"))

    models = [(first.result.model_name.rsplit("@", 1)[0], mask)]
    if planted is not None and planted.mask is not None:
        models.append((planted.result.model_name.rsplit("@", 1)[0], planted.mask))
    found = [(name, *depth(m), m.shape[0]) for name, m in models]
    testable = [f for f in found if math.isfinite(f[1]) and math.isfinite(f[2])]
    each = {n: "holds" if p < s else "does not hold" for n, p, s, _ in testable}
    verdict = ("cannot be tested here" if not testable else next(iter(each.values())) if len(set(each.values())) == 1
               else "mixed (" + "; ".join(f"{n}: {v}" for n, v in each.items()) + ")")
    rows.append((
        "Positional heads sit in earlier blocks, syntactic heads in later ones (Sec. 5.5, Figure 5)", verdict,
        "; ".join(f"{n}: mean block of positional heads {p:.1f}, of syntactic heads {s:.1f} (of {L})" for n, p, s, L in found),
    ))
    if conservation:
        lit, ref = conservation["Eq. 10 as written"], conservation["the authors' code"]
        rows.append((
            "The normalisation keeps relevance conserved under the mask (Sec. 4.3)",
            "holds" if lit["worst"] < 1e-4 else "does not hold",
            f"as written: largest per-block change of the relevance sum {lit['worst']:.1e}; the authors' code: input sum "
            f"{ref['input']:.3f} of 1 (largest per-block change {ref['worst']:.3f})",
        ))
    if planted is not None and "mask_lrp" in planted.values:
        from heedful.evaluate.intervals import bootstrap_paired_difference

        parts, found = [], []
        for other in ("rollout", "raw_attention", "attcat"):
            if other not in planted.values:
                continue
            ci = bootstrap_paired_difference(planted.values["mask_lrp"]["precision_at_k"], planted.values[other]["precision_at_k"])
            found.append(difference_verdict(ci, True))
            parts.append(f"− {other} {interval_text(*ci, sign=True)}")
        rows.append((
            "Higher precision@20 than Rollout, RawAtt and AttCAT on QA (Table 2)",
            f"{all_of(found)} on the planted proxy (not SQuAD)",
            f"{planted.dataset}, n = {len(planted.ids)}: Mask-LRP " + ", ".join(parts),
        ))
    else:
        rows.append(("Higher precision@20 than Rollout, RawAtt and AttCAT on QA (Table 2)", "cannot be tested here", "planted section not run"))
    rows += [
        ("The results hold for BERT-base on SST-2, IMDB, Yelp, MNLI, QQP and on SQuAD v1/v2 with BERT, GPT-2, RoBERTa",
         "cannot be tested here", "no such checkpoints or data on this machine (docs: MODELS.md); a 6-block MiniLM on movie / product snippets instead"),
    ]
    lines = [
        "## Claims of the paper against this run",
        "",
        LEGEND + " A claim naming both metrics holds when both do and does not hold when either does not. Ours = "
        "`mask_lrp` with Eq. 10 as written unless the row says otherwise.",
        "",
        "| claim (paper) | verdict | numbers (this run) |",
        "|---|---|---|",
        *[f"| {c} | {v} | {n} |" for c, v, n in rows],
        "",
    ]
    return lines


def _cost_table(runs: list[_DatasetRun], methods: list[str]) -> list[str]:
    lines = [
        "## Cost per example (explanation only; from the results store, summed over the runs that computed it)",
        "",
        "| method | " + " | ".join(f"{r.dataset} s / ex" for r in runs) + " | forward / ex | backward / ex | peak MB |",
        "|" + "---|" * (len(runs) + 4),
    ]
    for m in [*methods, *VARIANT_ROWS]:
        try:
            costs = [_cost(r, m) for r in runs]
        except KeyError:
            continue
        c0 = costs[0]
        lines.append(
            f"| {m} | " + " | ".join(_fmt(c.get("seconds"), digits=4) for c in costs)
            + f" | {_fmt(c0.get('forward'), digits=1)} | {_fmt(c0.get('backward'), digits=1)} | {_fmt(c0.get('peak_mb'), digits=0)} |"
        )
    lines += [
        "",
        "Wall seconds on a shared 2-core CPU, one torch thread, batches of 16; the numbers vary with the load of the machine. "
        "The perturbation curves (9 forward passes per example and method) are not included.",
        "",
    ]
    return lines


def _markdown(
    plan: _Plan,
    runs: list[_DatasetRun],
    mask,
    files: dict[str, str],
    seconds: float,
    planted: _PlantedRun | None = None,
    conservation: dict[str, dict[str, float]] | None = None,
) -> str:
    protocol = runs[0].result.spec.protocol
    methods = [m for m in plan.methods if m in runs[0].result.groups]
    model_name = runs[0].result.model_name
    times = _timings(plan, runs)
    computed = sum(times.get(f"{r.dataset}|{plan.split}|{r.result.n_examples}", r.seconds) for r in runs)
    lines = [
        "# Mask-LRP reproduction: Table 1 analogue, AOPC / LOdds against k, head map",
        "",
        "Regenerate with `heedful reproduce mask-lrp`"
        + (" (this file: `--quick` smoke run — **its numbers are not the report's**)" if plan.quick else "")
        + ". Paper: Song et al. 2024, *Better Explain Transformers by Illuminating Important Information* "
        "(Mask-LRP). Method: `mask_lrp` — Chefer et al.'s relevance rollout with the relevance of every head "
        "outside a selected set of syntactic and positional heads cut during the relevance pass. Two variants: "
        "**Eq. 10 as written** (`variant=\"literal\"`, the default: the kept heads' relevance renormalised so each "
        "block conserves relevance, the rollout averaging the kept heads only) and **the authors' code** "
        "(`variant=\"reference\"`: no renormalisation, the rollout over every head's map of the unmasked relevance). "
        "The paper's \"Ours\" and \"Random\" rows are the first; the second is shown beside them.",
        "",
        "## Setting",
        "",
        f"- model: `{model_name}` ({mask.shape[0]} blocks x {mask.shape[1]} heads) — the paper uses BERT-base (12 x 12), "
        "one fine-tuned checkpoint per data set",
    ]
    for run in runs:
        r = run.result
        skipped = ", ".join(f"{k}: {v}" for k, v in r.skipped.items()) or "none"
        lines.append(
            f"- data: `{run.dataset}` {r.spec.split} split, {DATASET_NOTES.get(Path(run.dataset).stem, 'user data')}; "
            f"**n = {r.n_examples}** (first examples kept by the protocol; skipped before the cut: {skipped})"
        )
    lines += [
        f"- protocol `{protocol.name}` (hash `{protocol.hash()}`): {protocol.citation}. Gold label explained and watched; "
        "tokens removed in descending score order, [CLS]/[SEP] never removed, replaced by id 0 ([PAD]), length kept, "
        "segment ids all zero; k = unique(round(linspace(0, 1, 10) · N))[1:] with N counting special tokens "
        "(nominal 11 % … 100 %); AOPC = mean over k of p(gold | x) − p(gold | x̃_k), LOdds = mean over k of "
        "log p(gold | x̃_k) / p(gold | x); examples under 20 tokens skipped",
        f"- head mask: {int(mask.mask.sum())} of {mask.mask.size} heads kept (**mask rate {mask.rate:.1%}**), see below",
        f"- seeds: random head masks {plan.mask_seeds} (seeds 0..{plan.mask_seeds - 1}); corrupted masks "
        f"{plan.corruption_seeds} per rate; random token scores "
        f"{protocol.random_seeds}; integrated gradients with {plan.ig_steps} Gauss-Legendre steps",
        f"- run time: the run that completed the store for this n computed for {computed / 60:.1f} min ("
        + ", ".join(f"{r.dataset} {times.get(f'{r.dataset}|{plan.split}|{r.result.n_examples}', r.seconds) / 60:.1f} min" for r in runs)
        + f", wall clock on a shared 2-core machine under the load of other jobs, on top of whatever earlier runs had stored); writing this file took {seconds / 60:.1f} min, reusing the "
        "explanations and curves kept in the results store. The explanations' own cost per example is in the cost "
        "table below; on top of it every method run measures 9 perturbed forward passes per example",
        "",
        "## Table 1 analogue",
        "",
        "The paper's numbers are for BERT-base on SST-2 / IMDB / Yelp validation or test data; ours are for a smaller "
        "model on other, shorter texts, so only orderings can be compared, not values. Paper row \"GAE\" is Chefer et "
        "al. 2021a's relevance rollout (its code's `generate_LRP`), heedful's `chefer`; heedful's `gae` (Chefer et al. "
        "2021b) is listed among the extra methods. Paper row \"Random\" is Mask-LRP with a random head mask of the same "
        "rate (mean ± std over seeds), not random token scores.",
        "",
    ]
    notes = []
    for run in runs:
        table, found = _dataset_table(run, methods)
        lines += table
        notes += _ordering_notes(run, found)
    lines += ["### Where the orderings agree and differ", "", *notes]
    lines += _headline_section(runs, methods)
    lines += [
        "The paper's full Table 1 (BERT-base) for the single-text data sets, for reference:",
        "",
        "| paper row | SST-2 AOPC | SST-2 LOdds | IMDB AOPC | IMDB LOdds | Yelp AOPC | Yelp LOdds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, cols in PAPER_TABLE1.items():
        cells = []
        for col in ("SST-2", "IMDB", "Yelp"):
            a, lo, a_sd, lo_sd = cols[col]
            cells += [_fmt(a, a_sd), _fmt(lo, lo_sd)]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", "## AOPC and LOdds against k (paper Figure 3)", ""]
    for run in runs:
        lines += [f"![AOPC and LOdds against k on {run.dataset}]({files['curves-' + run.dataset]})", ""]
        lines += _curve_tables(run, [*methods, *VARIANT_ROWS])
    lines += [
        "## Deletion curves",
        "",
        "Mean probability of the gold label as the top-k tokens are replaced; k = 0 is the intact input. "
        "The area under it is heedful's `deletion` metric (lower is better):",
        "",
        f"![deletion curves]({files['deletion']})",
        "",
        "| method | " + " | ".join(f"{r.dataset} deletion area ↓" for r in runs) + " |",
        "|" + "---|" * (len(runs) + 1),
    ]
    for m in [*methods, *VARIANT_ROWS]:
        cells = [_fmt(*_ours(r, m, "deletion")) for r in runs]
        lines.append(f"| {'**mask_lrp**' if m == 'mask_lrp' else m} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += _mask_section(mask, files["heads"])
    lines += _ablation_section(runs, mask, files["ablation"])
    if "corruption" in files:
        lines += _corruption_section(runs[0], files["corruption"])
    lines += _why_section(runs, mask, planted, conservation or {})
    if planted is not None:
        lines += _planted_section(plan, planted)
    lines += _cost_table(runs, methods)
    lines += [
        "## Differences from the paper's setting",
        "",
        f"- Model and data: `{model_name.rsplit('@', 1)[0]}` ({mask.shape[0]} blocks) and "
        + ("VADER's snippet sets" if all(Path(r.dataset).stem in PAIRED for r in runs) else "the data named above")
        + " instead of BERT-base checkpoints per data set and SST-2 / IMDB / Yelp / MNLI / QQP; no sentence-pair data, "
        "and no SQuAD: "
        + ("precision@20 is measured on planted long contexts with a causal LM instead (section above)."
           if planted is not None else "precision@20 is not measured (planted section left out)."),
        f"- n: {', '.join(f'{r.dataset} {r.result.n_examples}' for r in runs)} examples: the first "
        f"{', '.join(f'{plan.n_for(r.dataset)} of {r.dataset}' for r in runs)} in the test split that are 20 tokens or longer "
        "(the paper uses whole validation / test sets; the product reviews are fewer because their perturbation curves "
        "cost about four times a movie snippet's). Standard error of Mask-LRP's mean AOPC over the examples: "
        + ", ".join(f"{r.dataset} {_standard_error(r, 'mask_lrp', 'aopc'):.3f}" for r in runs)
        + "; every comparison above carries a 95 % bootstrap interval, paired over the examples where two methods are "
        "compared; the random-mask std is over seeds, not over examples.",
        "- Mask-LRP itself: the default `mask_lrp` follows Sec. 4.3 as written — the kept heads' relevance "
        "renormalised in the A·V step so that each block conserves relevance (a block with no kept head passes "
        "everything down its residual, the only way left to conserve it), and Eq. 10's mean over the kept heads "
        "only. The authors' code (ExplanationGenerator.MGAE), kept as `variant=\"reference\"`, differs: no "
        "renormalisation (the cut heads' relevance is lost, see the conservation table), the rollout's maps taken "
        "from the *unmasked* head relevance (unhalved) and averaged over every head. The paper's separate "
        "normalisation of R_synt and R_pos is one factor here (the same when their sums share a sign).",
        "- Head statistics: spaCy's parser instead of Stanza; statistics from the movie-review train split "
        "(the data the zoo model was fine-tuned on); the Eq. 7 baseline lambda_k is our reading of the paper "
        "(best fixed-offset accuracy per relation).",
        f"- Figure 4 (mask corruption), the threshold sweep and Table 3 run on {runs[0].dataset} only (the paper: "
        "SST-2 for Figure 4, SST-2 and QQP for Table 3); Table 4's ALTC is heedful's `alti` (Ferrando et al. 2022) "
        "when it is among the methods.",
        "",
        "## Protocol fields",
        "",
        "| field | value |",
        "|---|---|",
        *[f"| {k} | `{v}` |" for k, v in protocol.describe()],
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- entry point
def write(out_dir: Path, settings: ReportSettings) -> Path:
    """Run the Mask-LRP experiments and write ``out_dir/mask-lrp.md`` with its ``mask-lrp-*.png`` plots."""
    import heedful
    from heedful.evaluate.protocol import get_protocol
    from heedful.lrp.heads import plot_head_map

    began = time.perf_counter()
    plan = _plan(settings)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan.store.mkdir(parents=True, exist_ok=True)
    if plan.only == "planted":
        planted = _planted_run(plan)
        path = out_dir / f"{NAME}-planted.md"
        head = [
            "# Mask-LRP reproduction: the planted precision@20 section alone",
            "",
            f"Regenerate with `heedful reproduce mask-lrp -O only=planted{' --quick' if plan.quick else ''}` "
            "(a development run of one section of `mask-lrp.md`"
            + ("; `--quick`: **its numbers are not the report's**" if plan.quick else "") + ").",
            "",
        ]
        path.write_text("\n".join([*head, *_planted_section(plan, planted)]), encoding="utf-8")
        return path
    model = heedful.load(plan.model)
    mask = _load_mask(plan, model)
    shape = (model.adapter.num_layers, model.adapter.config.num_attention_heads)
    if mask.shape != shape:
        from heedful.errors import InputError

        raise InputError(f"the head mask is {mask.shape[0]} x {mask.shape[1]}, the model has {shape[0]} x {shape[1]} heads")
    protocol = dataclasses.replace(get_protocol("mask-lrp"), random_seeds=plan.random_seeds)
    extras = plan.datasets[:1] if plan.extras is None else plan.extras
    runs = [_run_dataset(plan, model, dataset, mask, protocol, first=dataset in extras) for dataset in plan.datasets]
    methods = [m for m in plan.methods if m in runs[0].result.groups]

    files: dict[str, str] = {}
    for run in runs:
        stem = Path(run.dataset).stem
        path = _plot_curves(run, [*methods, *VARIANT_ROWS], out_dir / f"{NAME}-curves-{stem}.png")
        files["curves-" + run.dataset] = path.name
    files["deletion"] = _plot_deletion(runs, [*methods, *VARIANT_ROWS], out_dir / f"{NAME}-deletion.png").name
    files["heads"] = plot_head_map(mask, out_dir / f"{NAME}-heads.png").name
    files["ablation"] = _plot_ablation(runs, out_dir / f"{NAME}-random-masks.png").name
    if "chefer" in runs[0].values and any(k.startswith("mask_lrp (corrupted") for k in runs[0].variants):
        files["corruption"] = _plot_corruption(runs[0], out_dir / f"{NAME}-corruption.png").name
    conservation = _conservation(model, plan.datasets[0], plan.split, mask)
    planted = _planted_run(plan) if plan.planted_model is not None else None
    report = out_dir / f"{NAME}.md"
    report.write_text(
        "\n".join([_markdown(plan, runs, mask, files, time.perf_counter() - began, planted, conservation),
                   *_claims_section(runs, mask, planted, conservation)]),
        encoding="utf-8",
    )
    return report
