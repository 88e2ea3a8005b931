"""Mask-LRP report, running: the plan from the report's options, the bench runs of both datasets,
the variants (random, corrupted and swept head masks), the planted long-context run and the
conservation check."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from heedful.reproduce import ReportSettings
from heedful.reproduce.toolkit import count_option, option_list

NAME = "mask-lrp"
DEFAULT_N = 500
#: Examples per data set where they differ from ``DEFAULT_N``: ``NAME:N`` entries (none by
#: default; amazon's test split has 246 snippets of 20 tokens or more, and all of them are used).
DEFAULT_DATASET_N = ""
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

#: The deeper classifier the Table 1 analogue also runs on (its own head mask, the first data set).
DEEP_MODEL = "smollm2-sentiment"
#: Examples of it. Every method and Mask-LRP variant of the section took 716 s for 8 movie snippets
#: on a shared 2-core machine (load about 6): about 30 s an example when the report runs alone, so
#: 100 examples add about 50 min, and the head mask (9,568 train texts, once per model) 7-20 min.
DEEP_N = 100
DEEP_QUICK_N = 4
#: Its methods by default: the paper's Table 1 rows and random token scores (as a floor).
DEEP_METHODS = (*(m for m in PAPER_ROWS if m != RANDOM_MASK), "random")

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
#: The paper's Table 3 (BERT-base; AOPC up, LOdds down): row -> column -> (AOPC, LOdds).
PAPER_TABLE3: dict[str, dict[str, tuple[float, float]]] = {
    "Ours": {"SST-2": (0.438, -1.208), "QQP": (0.451, -6.001)},
    "Ours w/o M_pos": {"SST-2": (0.438, -1.208), "QQP": (0.450, -6.001)},
    "Ours w/o M_synt": {"SST-2": (0.437, -1.205), "QQP": (0.449, -5.998)},
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
    deep_model: str | None = DEEP_MODEL
    deep_n: int = DEEP_N
    deep_methods: list[str] = dataclasses.field(default_factory=list)
    deep_head_mask: str | None = None

    def n_for(self, dataset: str) -> int:
        """Examples of ``dataset``: its ``dataset_n`` entry, else ``n``."""
        return self.dataset_n.get(dataset, self.n)


def _plan(settings: ReportSettings) -> _Plan:
    from heedful.errors import InputError
    from heedful.files.cache import heedful_home

    opts = dict(settings.options)
    known = {"model", "datasets", "split", "methods", "mask_seeds", "random_seeds", "ig_steps", "batch_size", "head_mask",
             "planted_model", "planted_n", "planted_length", "planted_methods", "only", "dataset_n", "corruption_seeds",
             "extras", "deep_model", "deep_n", "deep_methods", "deep_head_mask"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise InputError(f"unknown mask-lrp report option {unknown[0]!r}", hint="options: " + ", ".join(sorted(known)))
    quick = settings.quick
    n = settings.n if settings.n is not None else (QUICK_N if quick else DEFAULT_N)
    if n < 1:
        raise InputError(f"n must be positive, got {n}")
    methods = option_list(opts.get("methods", METHODS))
    if "mask_lrp" not in methods:
        methods.append("mask_lrp")
    only = None if opts.get("only") in (None, "") else str(opts["only"])
    if only not in (None, "planted"):
        raise InputError(f"unknown mask-lrp section {only!r}", hint="only=planted runs the planted precision@20 section alone")
    planted_model = str(opts.get("planted_model", PLANTED_MODEL))
    if planted_model.lower() in ("none", "") and only == "planted":
        raise InputError("only=planted needs a planted_model", hint=f"e.g. planted_model={PLANTED_MODEL}")
    planted_n = count_option(opts, "planted_n", PLANTED_QUICK_N if quick else PLANTED_N)
    dataset_n = {}
    for item in option_list(opts.get("dataset_n", DEFAULT_DATASET_N if not quick and settings.n is None else "")):
        name, _, count = item.rpartition(":")
        if not name or not count.isdigit() or int(count) < 1:
            raise InputError(f"bad dataset_n entry {item!r}", hint="dataset_n=NAME:N[,NAME:N], e.g. dataset_n=amazon:200")
        dataset_n[name] = int(count)
    datasets = option_list(opts.get("datasets", DEFAULT_DATASETS))
    extras = None if "extras" not in opts else [d for d in option_list(opts["extras"]) if d.lower() != "none"]
    strange = sorted(set(extras or []) - set(datasets))
    if strange:
        raise InputError(f"extras names {strange[0]!r}, which is not a data set of this run",
                         hint="extras=NAME[,NAME] from datasets=" + ",".join(datasets) + ", or extras=none")
    deep_model = str(opts.get("deep_model", DEEP_MODEL))
    deep_head_mask = None if opts.get("deep_head_mask") in (None, "") else str(opts["deep_head_mask"])
    if deep_head_mask is not None and not Path(deep_head_mask).is_file():
        raise InputError(f"no head-mask file {deep_head_mask!r} (deep_head_mask)",
                         hint="a mask saved by `heedful heads --model MODEL --out mask.json`, or leave the option out")
    deep_methods = option_list(opts["deep_methods"]) if "deep_methods" in opts else [m for m in methods if m in DEEP_METHODS]
    if "mask_lrp" not in deep_methods:
        deep_methods.append("mask_lrp")
    return _Plan(
        model=str(opts.get("model", DEFAULT_MODEL)),
        datasets=datasets,
        split=str(opts.get("split", "test")),
        n=n,
        methods=methods,
        mask_seeds=count_option(opts, "mask_seeds", 2 if quick else 3),
        random_seeds=count_option(opts, "random_seeds", 2),
        ig_steps=count_option(opts, "ig_steps", 4 if quick else 16),
        batch_size=count_option(opts, "batch_size", 16),
        head_mask=None if opts.get("head_mask") in (None, "") else str(opts["head_mask"]),
        store=Path(settings.store) if settings.store is not None else heedful_home() / "reproduce" / NAME,
        quick=quick,
        progress=settings.progress,
        planted_model=None if planted_model.lower() in ("none", "") else planted_model,
        planted_n=planted_n,
        planted_length=count_option(opts, "planted_length", PLANTED_LENGTH),
        planted_methods=option_list(opts["planted_methods"]) if "planted_methods" in opts else [m for m in methods if m not in PLANTED_SKIPPED],
        only=only,
        dataset_n=dataset_n,
        corruption_seeds=count_option(opts, "corruption_seeds", 1),
        extras=extras,
        deep_model=None if deep_model.lower() in ("none", "") else deep_model,
        deep_n=count_option(opts, "deep_n", DEEP_QUICK_N if quick else DEEP_N),
        deep_methods=deep_methods,
        deep_head_mask=deep_head_mask,
    )


# ---------------------------------------------------------------------------- running
#: Labels of the Mask-LRP runs besides the main bench's ``mask_lrp`` (the literal variant, the
#: default, under the selected mask).
REFERENCE = "mask_lrp (reference)"
RANDOM_REFERENCE = "mask_lrp (reference, random mask)"
NO_POSITIONAL = "mask_lrp (w/o positional heads)"
NO_SYNTACTIC = "mask_lrp (w/o syntactic heads)"
#: Eq. 10's E_h as the mean over all heads of a block, the cut heads contributing 0 (``heads_mean="all"``).
ALL_HEADS = "mask_lrp (E_h over all heads)"
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
    kept: float = float("nan")
    """Heads kept (mean over seeds)."""

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
    model: str = ""
    """The model's name when it is not the report's main model (the deeper classifier's run)."""

    @property
    def name(self) -> str:
        """The data set, with the model when it is not the report's main one (``smollm2-sentiment movies``)."""
        return f"{self.model} {self.dataset}" if self.model else self.dataset


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
    return _Variant(label, keys, values, seed_means, curves, cost, rate, float(np.mean([np.sum(m) for m in masks])))


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
    run(ALL_HEADS, [{"head_mask": mask_list, "heads_mean": "all"}], [mask.mask])
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
    pairs = [("literal vs reference", real, variants[REFERENCE].keys[0]),
             ("literal: E_h over all heads vs over kept heads", real, variants[ALL_HEADS].keys[0])]
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


def _time_label(run, split: str) -> str:
    """The key of ``run``'s wall time in :func:`_timings` (the model's name first for a run of another model)."""
    return (f"{run.model}|" if getattr(run, "model", "") else "") + f"{run.dataset}|{split}|{run.result.n_examples}"


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
        label = _time_label(run, plan.split)
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
        mask = _model_mask(model.adapter, plan.quick)
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


def _model_mask(adapter, quick: bool, path: str | None = None):
    """A model's Mask-LRP head mask: the saved mask at ``path``, else the model's own, selected
    from the movie-review train split (its first 1,000 texts in a quick run) and cached -- the
    planted model's and the deeper classifier's."""
    from heedful.lrp.heads import default_head_mask
    from heedful.lrp.masks import HeadMask

    if path is not None:
        return HeadMask.load(path)
    return default_head_mask(adapter, limit=1000 if quick else None)


def _load_mask(plan: _Plan, model):
    from heedful.lrp.heads import default_head_mask
    from heedful.lrp.masks import HeadMask

    if plan.head_mask is not None:
        return HeadMask.load(plan.head_mask)
    return default_head_mask(model.adapter)


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
