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
:data:`PLANTED_LENGTH`), ``planted_methods`` (default: ``methods``); ``only=planted`` runs that
section alone and writes ``<out>/mask-lrp-planted.md`` (never the full report).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from heedful.reproduce import ReportSettings

NAME = "mask-lrp"
DEFAULT_N = 160
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
EXTRA_METHODS = ("gae", "attnlrp", "grad_x_input", "integrated_gradients", "random")
METHODS = tuple(m for m in PAPER_ROWS if m != RANDOM_MASK) + EXTRA_METHODS
EXTRA_NOTES = {
    "gae": "Chefer et al. 2021b: gradient-weighted raw attention, no LRP",
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


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def _plan(settings: ReportSettings) -> _Plan:
    from heedful.cache import heedful_home
    from heedful.errors import InputError

    opts = dict(settings.options)
    known = {"model", "datasets", "split", "methods", "mask_seeds", "random_seeds", "ig_steps", "batch_size", "head_mask",
             "planted_model", "planted_n", "planted_length", "planted_methods", "only"}
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
    planted_n = int(opts.get("planted_n", PLANTED_QUICK_N if quick else PLANTED_N))
    if planted_n < 1:
        raise InputError(f"planted_n must be positive, got {planted_n}")
    return _Plan(
        model=str(opts.get("model", DEFAULT_MODEL)),
        datasets=_as_list(opts.get("datasets", DEFAULT_DATASETS)),
        split=str(opts.get("split", "test")),
        n=n,
        methods=methods,
        mask_seeds=int(opts.get("mask_seeds", 2 if quick else 3)),
        random_seeds=int(opts.get("random_seeds", 2)),
        ig_steps=int(opts.get("ig_steps", 4 if quick else 16)),
        batch_size=int(opts.get("batch_size", 16)),
        head_mask=None if opts.get("head_mask") in (None, "") else str(opts["head_mask"]),
        store=Path(settings.store) if settings.store is not None else heedful_home() / "reproduce" / NAME,
        quick=quick,
        progress=settings.progress,
        planted_model=None if planted_model.lower() in ("none", "") else planted_model,
        planted_n=planted_n,
        planted_length=int(opts.get("planted_length", PLANTED_LENGTH)),
        planted_methods=_as_list(opts["planted_methods"]) if "planted_methods" in opts else list(methods),
        only=only,
    )


# ---------------------------------------------------------------------------- running
@dataclasses.dataclass
class _Ablation:
    """Mask-LRP with random head masks of the real mask's size (per-seed summaries), and how much
    the random masks, an empty mask and a mask of ones change the token scores (``sensitivity``)."""

    seeds: list[int]
    values: dict[str, list[float]]
    curves: dict[str, list[np.ndarray]]
    cost: dict[str, float]
    sensitivity: dict[str, dict[str, float]]

    def mean(self, metric: str) -> float:
        return float(np.mean(self.values[metric]))

    def std(self, metric: str) -> float:
        vals = self.values[metric]
        return float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")

    def curve(self, metric: str) -> tuple[np.ndarray, np.ndarray | None]:
        stack = np.stack(self.curves[metric])
        return np.nanmean(stack, axis=0), (np.nanstd(stack, axis=0, ddof=1) if len(stack) > 1 else None)


@dataclasses.dataclass
class _DatasetRun:
    dataset: str
    result: Any  # BenchResult
    ablation: _Ablation
    seconds: float
    paired: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)


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
        n=plan.n,
        seed=0,
        batch_size=plan.batch_size,
        method_options=options,
    )


#: Fixed masks run beside the random ones: no head kept, every head kept.
FIXED_MASKS = {"no head kept": 0, "every head kept": 1}


def _run_dataset(plan: _Plan, model, dataset: str, mask_list: list, protocol) -> _DatasetRun:
    from heedful.evaluate.bench import run_bench

    began = time.perf_counter()
    options = {"mask_lrp": {"head_mask": mask_list}, "integrated_gradients": {"n_steps": plan.ig_steps}}
    options = {m: o for m, o in options.items() if m in plan.methods}  # the bench refuses options of absent methods
    result = run_bench(_spec(plan, model, dataset, plan.methods, options, protocol), progress=plan.progress)
    seeds = list(range(plan.mask_seeds))
    values: dict[str, list[float]] = {m: [] for m in METRICS}
    curves: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
    costs = []
    variant_keys: dict[str, Any] = {}
    for seed in seeds:
        ablated = {"mask_lrp": {"head_mask": mask_list, "ablation": "random", "ablation_seed": seed}}
        got = run_bench(_spec(plan, model, dataset, ["mask_lrp"], ablated, protocol), progress=plan.progress)
        group = got.groups["mask_lrp"]
        for m in METRICS:
            values[m].append(group.summaries[m].value)
            curves[m].append(np.asarray(group.summaries[m].curve, dtype=float))
        costs.append(group.cost)
        variant_keys[f"random mask (seed {seed})"] = got.runs[0].key
    for label, fill in FIXED_MASKS.items():
        constant = {"mask_lrp": {"head_mask": np.full(np.shape(mask_list), fill).tolist()}}
        variant_keys[label] = _explain_only(plan, model, dataset, constant, protocol)
    cost = {k: float(np.mean([c[k] for c in costs])) for k in ("seconds", "forward", "backward")} if costs else {}
    cost["peak_mb"] = max((c["peak_mb"] for c in costs), default=float("nan"))
    real_key = next(r.key for r in result.runs if r.method == "mask_lrp")
    pairs = [(label, real_key, other) for label, other in variant_keys.items()]
    chefer_key = next((r.key for r in result.runs if r.method == "chefer"), None)
    if chefer_key is not None:
        pairs.append(("chefer", real_key, chefer_key))
        pairs.append(("every head kept, against chefer", chefer_key, variant_keys["every head kept"]))
    sensitivity = _sensitivity(plan, model, result.spec, pairs)
    ablation = _Ablation(seeds, values, curves, cost, sensitivity)
    paired = _paired(plan, model, result, real_key, chefer_key) if chefer_key is not None else {}
    return _DatasetRun(dataset, result, ablation, time.perf_counter() - began, paired)


def _paired(plan: _Plan, model, result, key_a, key_b) -> dict[str, tuple[float, float]]:
    """Mean and standard error over examples of the per-example difference ``a - b`` per metric."""
    from heedful.evaluate.bench import per_example_from_store, select_inputs
    from heedful.evaluate.store import ResultsStore

    ids = [i.id for i in select_inputs(model, result.spec, {})[0]]
    phash = result.spec.protocol.hash()
    found = {}
    with ResultsStore(plan.store) as store:
        for metric in METRICS:
            a = per_example_from_store(store, key_a, metric, phash, ids).values
            b = per_example_from_store(store, key_b, metric, phash, ids).values
            d = (a - b)[np.isfinite(a - b)]
            found[metric] = (float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))) if d.size > 1 else (float("nan"), float("nan"))
    return found


def _explain_only(plan: _Plan, model, dataset: str, options, protocol):
    """Store Mask-LRP explanations under ``options`` without measuring their curves (the
    sensitivity table compares scores only); returns their store key."""
    from heedful.evaluate import bench
    from heedful.evaluate.store import ResultsStore

    spec = _spec(plan, model, dataset, ["mask_lrp"], options, protocol)
    inputs, data = bench.select_inputs(model, spec, {})
    run = bench.make_runs(spec, bench.spec_subject(spec, data))[0]
    with ResultsStore(plan.store) as store:
        bench._explain_missing(model, store, run, inputs, spec, None, None)
    return run.key


def _sensitivity(plan: _Plan, model, spec, pairs: list[tuple[str, Any, Any]]) -> dict[str, dict[str, float]]:
    """How far the token scores of one run are from another's over the run's examples
    (non-special tokens): share of examples ranked in exactly the same order, mean Spearman rho,
    and the largest score difference relative to the example's largest score."""
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
    mask_rate = None
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
        mask_rate, time.perf_counter() - began,
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

        def cell(v: tuple[float, float, float]) -> str:
            return f"{_fmt(v[0])} [{_fmt(v[1])}, {_fmt(v[2])}]"

        paper = PAPER_ROWS.get(group, "")
        name = f"**{group}**" if group == "mask_lrp" else group
        lines.append(
            f"| {name} | {paper} | {cell(found['all'])} | {cell(found['answered'])} | {_fmt(run.code_ratio.get(group))} | "
            f"{cell(found['top1'])} | {cell(found['top3'])} |"
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
    """(value, std over seeds or None) of one of our rows."""
    if method == RANDOM_MASK:
        return run.ablation.mean(metric), run.ablation.std(metric)
    group = run.result.groups.get(method)
    if group is None:
        return float("nan"), None
    summary = group.summaries[metric]
    return summary.value, (summary.std if group.seeds > 1 else None)


def _standard_error(run: _DatasetRun, method: str, metric: str) -> float:
    """Standard error over examples of a method's mean metric."""
    summary = run.result.groups[method].summaries[metric]
    return summary.std / math.sqrt(summary.n) if summary.n else float("nan")


def _curve(run: _DatasetRun, method: str, metric: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    if method == RANDOM_MASK:
        return run.ablation.curve(metric)
    group = run.result.groups.get(method)
    if group is None or group.summaries[metric].curve is None:
        return None, None
    return np.asarray(group.summaries[metric].curve, dtype=float), group.curve_std.get(metric)


def _cost(run: _DatasetRun, method: str) -> dict[str, float]:
    if method == RANDOM_MASK:
        return run.ablation.cost
    return run.result.groups[method].cost


def _fmt(value: float | None, std: float | None = None, digits: int = 3) -> str:
    from heedful.evaluate.report import fmt

    return fmt(float("nan") if value is None else value, std, digits)


def _ranks(values: dict[str, float], higher_better: bool) -> dict[str, int]:
    """Competition ranks (1 = best); values equal to three decimals share a rank."""
    finite = {k: round(v if higher_better else -v, 3) for k, v in values.items() if math.isfinite(v)}
    return {k: 1 + sum(other > v for other in finite.values()) for k, v in finite.items()}


def _spearman(a: dict[str, float], b: dict[str, float]) -> float:
    keys = [k for k in a if k in b and math.isfinite(a[k]) and math.isfinite(b[k])]
    if len(keys) < 3:
        return float("nan")
    from scipy.stats import spearmanr

    return float(spearmanr([a[k] for k in keys], [b[k] for k in keys]).statistic)


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

    if method == "mask_lrp":
        return "red", "o", "-"
    if method == RANDOM_MASK:
        return "#333333", "s", "--"
    if method == "random":
        return "#999999", "x", ":"
    markers = "v^<>DPX*hp8d"
    palette = (0, 2, 4, 8, 10, 12, 14, 16, 18, 1, 3, 5, 9, 11, 13, 15, 17, 19)  # tab20 without the reds
    return matplotlib.colormaps["tab20"](palette[k % len(palette)]), markers[k % len(markers)], "-"


def _label(method: str) -> str:
    return f"{PAPER_ROWS[method]} [{method}]" if method in PAPER_ROWS and method != RANDOM_MASK else (
        "Random mask [mask_lrp, random heads]" if method == RANDOM_MASK else method
    )


def _plot_curves(run: _DatasetRun, methods: list[str], path: Path) -> Path:
    """AOPC and LOdds against k, one line per method (random-mask band: +- one std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = 100 * np.asarray(run.result.x, dtype=float)
    fig, axes = plt.subplots(1, 2, figsize=(15, 6), facecolor="white")
    for ax, metric, ylabel in zip(axes, ("aopc", "log_odds"), ("AOPC (higher is better)", "LOdds (lower is better)"), strict=True):
        for k, method in enumerate(methods):
            curve, std = _curve(run, method, metric)
            if curve is None:
                continue
            color, marker, line = _style(method, k)
            width = 2.6 if method == "mask_lrp" else 1.4
            ax.plot(x[: len(curve)], curve, marker=marker, markersize=5, linestyle=line, linewidth=width, color=color, label=_label(method))
            if std is not None and method == RANDOM_MASK:
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
                    linewidth=2.6 if method == "mask_lrp" else 1.3, color=color, label=_label(method))
            if std is not None and method == RANDOM_MASK:
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
    """AOPC and LOdds of each random head mask (points) against the real mask (line) and the
    full-mask rollout (``chefer``, dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), facecolor="white")
    for ax, metric, ylabel in zip(axes, ("aopc", "log_odds"), ("mean AOPC (higher is better)", "mean LOdds (lower is better)"), strict=True):
        for i, run in enumerate(runs):
            vals = run.ablation.values[metric]
            jitter = np.linspace(-0.12, 0.12, len(vals)) if len(vals) > 1 else np.zeros(len(vals))
            ax.scatter(i + jitter, vals, color="#555555", s=28, zorder=3, label="random masks (one per seed)" if i == 0 else None)
            real, _ = _ours(run, "mask_lrp", metric)
            ax.hlines(real, i - 0.3, i + 0.3, color="red", linewidth=2.5, label="real mask" if i == 0 else None)
            full, _ = _ours(run, "chefer", metric)
            if math.isfinite(full):
                ax.hlines(full, i - 0.3, i + 0.3, color="#1f77b4", linestyle=":", linewidth=2, label="all heads (chefer)" if i == 0 else None)
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels([r.dataset for r in runs])
        ax.set_xlim(-0.6, len(runs) - 0.4)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("Mask-LRP: real head mask vs random masks of the same size")
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
    """Table 1 analogue of one data set, with the paired paper column, and what the orderings say."""
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
        f"| paper row [heedful method] | AOPC ↑ ours | LOdds ↓ ours | AOPC ↑ paper {col} | LOdds ↓ paper {col} | "
        "rank AOPC ours / paper | rank LOdds ours / paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in rows:
        (a, a_sd), (lo, lo_sd) = ours[m]["aopc"], ours[m]["log_odds"]
        p = paper[m]
        pa = _fmt(p[0], p[2]) if p else "–"
        pl = _fmt(p[1], p[3]) if p else "–"
        name = f"**{PAPER_ROWS[m]}** [`mask_lrp`]" if m == "mask_lrp" else (
            f"{PAPER_ROWS[m]} [`mask_lrp`, random heads]" if m == RANDOM_MASK else f"{PAPER_ROWS[m]} [`{m}`]"
        )
        lines.append(
            f"| {name} | {_fmt(a, a_sd)} | {_fmt(lo, lo_sd)} | {pa} | {pl} | "
            f"{r_ours_a.get(m, '–')} / {r_pap_a.get(m, '–')} | {r_ours_l.get(m, '–')} / {r_pap_l.get(m, '–')} |"
        )
    extras = [m for m in methods if m not in PAPER_ROWS]
    for m in extras:
        (a, a_sd), (lo, lo_sd) = _ours(run, m, "aopc"), _ours(run, m, "log_odds")
        lines.append(f"| *not in the paper:* `{m}` ({EXTRA_NOTES.get(m, '')}) | {_fmt(a, a_sd)} | {_fmt(lo, lo_sd)} | – | – | – | – |")
    lines += [
        "",
        "Random mask: mean ± std over seeds; `random`: mean ± std over seeds of random token scores. "
        "Ranks are among the paper's ten rows only; values equal to three decimals share a rank.",
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
    for other, label in (("chefer", "GAE (all heads, `chefer`)"), (RANDOM_MASK, "the random-mask rollout")):
        if other not in oa or other not in pa:
            continue
        d_ours, d_pap = oa["mask_lrp"] - oa[other], pa["mask_lrp"] - pa[other]
        dl_ours, dl_pap = ol["mask_lrp"] - ol[other], pl["mask_lrp"] - pl[other]
        if abs(d_ours) < 5e-4 and abs(dl_ours) < 5e-4:
            verdict = "**no difference here** (the paper finds Mask-LRP better)."
        elif (d_ours > 0) == (d_pap > 0) and (dl_ours < 0) == (dl_pap < 0):
            verdict = "same direction as the paper."
        else:
            verdict = "**not the paper's direction** on " + " and ".join(
                name for name, ok in (("AOPC", (d_ours > 0) == (d_pap > 0)), ("LOdds", (dl_ours < 0) == (dl_pap < 0))) if not ok
            ) + "."
        noise = ""
        if other == "chefer" and run.paired:
            (ma, sa), (ml, sl) = run.paired["aopc"], run.paired["log_odds"]
            noise = f" Paired over the examples: AOPC {ma:+.3f} ± {sa:.3f}, LOdds {ml:+.3f} ± {sl:.3f} (standard errors)."
        lines.append(
            f"- Mask-LRP minus {label}: AOPC {d_ours:+.3f} (paper {d_pap:+.3f}), LOdds {dl_ours:+.3f} (paper {dl_pap:+.3f}) — "
            + verdict + noise
        )
    rho_a, rho_l = _spearman(oa, pa), _spearman(ol, pl)
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


def _ablation_section(runs: list[_DatasetRun], mask, image: str) -> list[str]:
    kept = int(mask.mask.sum())
    total = mask.mask.size
    overlap = kept * kept / total
    lines = [
        "## Ablation: random head masks of the same rate (paper Table 1 \"Random\", Sec. 5.4)",
        "",
        f"Mask-LRP run with {kept} heads drawn at random from the {total} (`ablation=\"random\"`, seeds "
        f"{', '.join(str(s) for s in runs[0].ablation.seeds)}), against the selected mask and against all heads (`chefer`). "
        "A random mask shares on average "
        f"{overlap:.2f} heads with the real one.",
        "",
        f"![random masks vs the real mask]({image})",
        "",
        "| data | metric | real mask | random masks mean ± std | per seed | all heads (`chefer`) | "
        "real − random (in random stds) |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for run in runs:
        for metric, label in (("aopc", "AOPC ↑"), ("log_odds", "LOdds ↓")):
            real, _ = _ours(run, "mask_lrp", metric)
            mean, std = run.ablation.mean(metric), run.ablation.std(metric)
            full, _ = _ours(run, "chefer", metric)
            diff = real - mean
            z = diff / std if std and math.isfinite(std) and std > 0 else float("nan")
            per = ", ".join(f"{v:.4f}" for v in run.ablation.values[metric])
            zs = f"{z:+.1f}" if math.isfinite(z) else "std 0"
            lines.append(
                f"| {run.dataset} | {label} | {_fmt(real, digits=4)} | {_fmt(mean, std, digits=4)} | {per} | "
                f"{_fmt(full, digits=4)} | "
                f"{diff:+.4f} ({zs}) |"
            )
            better = diff > 0 if metric == "aopc" else diff < 0
            if abs(diff) < 5e-4:
                verdicts.append(f"{run.dataset} {label.split()[0]}: the same to three decimals")
            elif not math.isfinite(z) or abs(z) < 2:
                verdicts.append(f"{run.dataset} {label.split()[0]}: within two seed-to-seed stds")
            else:
                verdicts.append(
                    f"{run.dataset} {label.split()[0]}: real mask {'better' if better else 'worse'} by {abs(diff):.4f} "
                    f"({abs(z):.1f} seed-to-seed stds)"
                )
    lines += ["", "Real mask against random masks — " + "; ".join(verdicts) + ".", ""]
    lines += [
        "How much the head mask moves the token scores at all: explanations compared example by example with Mask-LRP's "
        "under the real mask (last row: a mask of ones against `chefer`), non-special tokens; \"same order\": the "
        "removal order of the protocol is identical. Besides the random masks: no head kept (a mask of zeros) and every "
        "head kept (a mask of ones); these two are compared on scores only, without perturbation curves.",
        "",
        "| data | variant | examples | same order | mean Spearman rho | largest score change (relative) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        for label, sens in run.ablation.sensitivity.items():
            lines.append(
                f"| {run.dataset} | {label} | {sens['examples']} | {sens['same_order']:.1%} | {sens['spearman']:.4f} | "
                f"{sens['max_rel_diff']:.2e} |"
            )
    lines.append("")
    randoms = [sens for run in runs for label, sens in run.ablation.sensitivity.items() if label.startswith("random")]
    empties = [run.ablation.sensitivity.get("no head kept") for run in runs]
    ones = [run.ablation.sensitivity.get("every head kept, against chefer") for run in runs]
    if all(o is not None and o["same_order"] >= 0.98 for o in ones):
        lines += [
            "A mask of ones ranks (almost) every example exactly as `chefer` does (only the scale of the scores "
            "differs), so `chefer` stands for the paper's 100 %-corrupted mask (Figure 4's end point).",
            "",
        ]
    if all(e is not None for e in empties):
        shares = ", ".join(f"{run.dataset} {e['same_order']:.0%}" for run, e in zip(runs, empties, strict=True))
        text = (
            f"A mask that keeps *no* head ranks the tokens exactly as the real mask does in {shares} of the examples "
            f"(largest score change {max(e['max_rel_diff'] for e in empties):.1e} of an example's largest score)."
        )
        if all(e["same_order"] >= 0.9 for e in empties):
            text = (
                "**The selected heads themselves barely shape Mask-LRP's explanations here.** " + text + f" The {kept} "
                "kept heads carry too little relevance to matter, so what separates the real mask from the random ones is "
                "mostly the gap between cutting every head and cutting all but a few random ones, not a merit of the "
                "selected heads; the paper's reading of its random-mask row (the selected heads beat random ones, "
                "Sec. 5.4) is not supported on this model, even where the sign of the difference matches."
            )
        lines += [text, ""]
    if randoms:
        worst_same = min(r["same_order"] for r in randoms)
        worst_rel = max(r["max_rel_diff"] for r in randoms)
        gaps = []
        for run in runs:
            real, full = _ours(run, "mask_lrp", "aopc")[0], _ours(run, "chefer", "aopc")[0]
            if math.isfinite(full) and abs(real - full) > 1e-9:
                gaps.append(f"{run.dataset} {(real - run.ablation.mean('aopc')) / (real - full):.0%}")
        every = float(np.mean([run.ablation.sensitivity["every head kept"]["spearman"] for run in runs]))
        lines += [
            f"Random masks change Mask-LRP's token scores by at most {worst_rel:.1e} of an example's largest score and "
            f"leave the removal order unchanged for at least {worst_same:.0%} of the examples"
            + (f"; the real mask's AOPC lead over them is {', '.join(gaps)} of its lead over `chefer` (all heads)" if gaps else "")
            + ". A likely reason for so small an effect: the explanation is the [CLS] row of the rollout. Cutting heads "
            "removes the relevance that attention sends to the other positions, while the relevance at [CLS] itself "
            "travels mostly along the residual stream, which no mask touches; with a few heads kept, the relevance left "
            "at the other positions is too small for its maps to move the [CLS] row of the rollout much (each map is "
            "added to the identity and row-normalised). With every head kept those maps do reorder tokens (mean "
            f"Spearman rho {every:.3f} against the real mask), and Mask-LRP then becomes `chefer`.",
            "",
        ]
    lines.append(
        f"With only {kept} of {total} heads kept the masks of every variant cut nearly all attention relevance, whichever "
        "heads are kept. The paper's own margin over its random masks is small as well (SST-2: 0.438 vs 0.432 ± 0.005 AOPC)."
        if kept <= 0.1 * total else
        "The paper's own margin over its random masks is small (SST-2: 0.438 vs 0.432 ± 0.005 AOPC)."
    )
    lines.append("")
    return lines


def _cost_table(runs: list[_DatasetRun], methods: list[str]) -> list[str]:
    lines = [
        "## Cost per example (explanation only; from the results store, summed over the runs that computed it)",
        "",
        "| method | " + " | ".join(f"{r.dataset} s / ex" for r in runs) + " | forward / ex | backward / ex | peak MB |",
        "|" + "---|" * (len(runs) + 4),
    ]
    for m in [*methods, RANDOM_MASK]:
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
    plan: _Plan, runs: list[_DatasetRun], mask, files: dict[str, str], seconds: float, planted: _PlantedRun | None = None
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
        "outside a selected set of syntactic and positional heads cut during the relevance pass.",
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
        f"- seeds: random head masks {plan.mask_seeds} (seeds 0..{plan.mask_seeds - 1}); random token scores "
        f"{protocol.random_seeds}; integrated gradients with {plan.ig_steps} Gauss-Legendre steps",
        f"- run time: the run that completed the store for this n computed for {computed / 60:.1f} min ("
        + ", ".join(f"{r.dataset} {times.get(f'{r.dataset}|{plan.split}|{r.result.n_examples}', r.seconds) / 60:.1f} min" for r in runs)
        + f", wall clock on a shared 2-core machine, on top of whatever smaller earlier runs had stored); writing this file took {seconds / 60:.1f} min, reusing the "
        "explanations and curves kept in the results store",
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
        lines += _curve_tables(run, [*methods, RANDOM_MASK])
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
    for m in [*methods, RANDOM_MASK]:
        cells = [_fmt(*_ours(r, m, "deletion")) for r in runs]
        lines.append(f"| {'**mask_lrp**' if m == 'mask_lrp' else m} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += _mask_section(mask, files["heads"])
    lines += _ablation_section(runs, mask, files["ablation"])
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
        f"- n: {', '.join(f'{r.dataset} {r.result.n_examples}' for r in runs)} examples (the paper uses whole "
        "validation / test sets), chosen so that the whole report computes in about an hour on a shared 2-core "
        "CPU: every method's explanations plus 9 perturbed forward passes per example for each of "
        f"{len(methods) + plan.random_seeds - 1 + plan.mask_seeds} method runs. Standard error of Mask-LRP's mean "
        "AOPC over the examples: "
        + ", ".join(f"{r.dataset} {_standard_error(r, 'mask_lrp', 'aopc'):.3f}" for r in runs)
        + " (differences between methods on the same examples are less noisy than that); the random-mask std is "
        "over seeds, not over examples.",
        "- Head statistics: spaCy's parser instead of Stanza; statistics from the movie-review train split "
        "(the data the zoo model was fine-tuned on); the Eq. 7 baseline lambda_k is our reading of the paper "
        "(best fixed-offset accuracy per relation).",
        "- Not run: the mask-corruption curve (Figure 4; its end point, a mask of ones, is `chefer` in the tables), "
        "Table 3 (mask without its positional / syntactic part), ALTI (Table 4).",
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
    mask_list = mask.mask.astype(int).tolist()  # in the options, so that the store keys depend on the mask
    protocol = dataclasses.replace(get_protocol("mask-lrp"), random_seeds=plan.random_seeds)
    runs = [_run_dataset(plan, model, dataset, mask_list, protocol) for dataset in plan.datasets]
    methods = [m for m in plan.methods if m in runs[0].result.groups]

    files: dict[str, str] = {}
    for run in runs:
        stem = Path(run.dataset).stem
        path = _plot_curves(run, [*methods, RANDOM_MASK], out_dir / f"{NAME}-curves-{stem}.png")
        files["curves-" + run.dataset] = path.name
    files["deletion"] = _plot_deletion(runs, [*methods, RANDOM_MASK], out_dir / f"{NAME}-deletion.png").name
    files["heads"] = plot_head_map(mask, out_dir / f"{NAME}-heads.png").name
    files["ablation"] = _plot_ablation(runs, out_dir / f"{NAME}-random-masks.png").name
    planted = _planted_run(plan) if plan.planted_model is not None else None
    report = out_dir / f"{NAME}.md"
    report.write_text(_markdown(plan, runs, mask, files, time.perf_counter() - began, planted), encoding="utf-8")
    return report
