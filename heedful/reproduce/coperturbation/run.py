"""Co-perturbation report, running: the plan from the report's options, every stage (solvers
compared, faithfulness bench, rectification, the studies, the seed check, steering, the
stability section) on the results store, and the stage timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heedful.errors import HeedfulError
from heedful.evaluate.share import EVERY, Share
from heedful.reproduce import ReportSettings
from heedful.reproduce.coperturbation.plots import _plot_lambda_study, _plot_layer_study
from heedful.reproduce.coperturbation.statistics import _bench_ids, _uniformity
from heedful.reproduce.toolkit import option_list

NAME = "coperturbation"
DATASET = "movies"
BASELINES = (
    "individual_perturbation", "leave_one_out", "lime", "kernel_shap", "rise", "lrp", "attnlrp", "tdd",
    "integrated_gradients", "normxlogit", "random",
)
"""The baselines: the paper's Figure 3 ones heedful has (LIME, SHAP as Kernel SHAP, RISE, LRP and
AttnLRP, TDD, individual perturbation), integrated gradients, and our controls (leave-one-out,
NormXLogit, random scores)."""
METHODS = ("coperturbation", *BASELINES)
MODELS = ("minilm-sentiment", "smollm2-sentiment")
LINEARIZED = {"solver": "linearized"}
"""Co-perturbation's options for the linearized solver (everything else at the defaults)."""
LIFTED = {"solver": "linearized", "scale": 1000.0}
"""The linearized solver with the noise ceiling lifted out of reach: interest then ranks tokens by
the Jacobian norm ``||J_j||_F`` (no ties at the ceiling)."""
N_COMPARE = 200
"""Test sentences on which the linearized and the optimised solutions are compared."""
N_BENCH = 500
"""Test sentences of the faithfulness benchmark of every method (the comparison's N_COMPARE are
their first)."""
COLLAPSE_RATIO = 0.9
"""The erasure ratio Figure 8 reaches: the collapse after the peak is tested only on a grid that gets there."""
BEYOND_SWEEP = (0.6, 0.7, 0.8, 0.9)
"""Erasure ratios the report adds to rectify's sweep (which stops at 0.5), up to :data:`COLLAPSE_RATIO`."""
N_STUDY = 100
"""Test sentences of the lambda, layer and probe studies (linearized solver)."""
N_RECTIFY = {"minilm-sentiment": 500, "smollm2-sentiment": 200}
"""Test sentences classified for the rectification (their errors are explained by every method;
on the SmolLM2 classifier only co-perturbation's linearized solver and random scores run)."""
BUDGET = {
    "individual_perturbation": {"samples": 4},
    "lime": {"n_samples": 100},
    "kernel_shap": {"n_samples": 100},
    "rise": {"n_masks": 100},
    "integrated_gradients": {"n_steps": 20},
}
"""The report's compute budget for the baselines (``--option budget=default`` runs every method's
defaults instead). Co-perturbation always runs at its defaults."""
PROBE_COUNTS = (4, 16)
"""Hutchinson probe counts whose seed stability is measured at the last layer."""
STEERING_HEADING = "## 8. Steering generation by suppressing prompt words (paper Section 5.4.2, Figure 9)"
N_SEED = 100
"""Dev sentences on which every setting's seed agreement is measured."""
N_WARM = 200
"""Dev sentences on which the warm start is compared with the cold start."""
STABILITY_MODEL = "minilm-sentiment"
SENTENCE = "a charming and often affecting journey"
WORDS = ("charming", "and")

QUICK = {
    "n_rectify": 60,
    "n_bench": 6,
    "n_compare": 6,
    "n_study": 4,
    "check": 2,
    "ratios": (0.1, 0.2, 0.3),
    "options": {
        "coperturbation": {"max_steps": 20, "window": 5},
        "individual_perturbation": {"samples": 2},
        "lime": {"n_samples": 30},
        "integrated_gradients": {"n_steps": 8},
        "kernel_shap": {"n_samples": 30},
        "rise": {"n_masks": 30},
    },
    "study": {"max_steps": 20, "window": 5},
    "lams": [0.2, 0.6, 1.0],
    "n_seed": 2,
    "n_warm": 2,
}

PAPER_SST2 = [
    # model, accuracy before ("no rho"), whole-set gain (x 1e-3), error-set gain ("common error part")
    ("BERT-110M", 0.9151, 2.903, 0.0667),
    ("BERT-340M", 0.9241, 6.121, 0.0110),
    ("GPT2-124M", 0.9025, 1.003, 0.1250),
    ("GPT2-355M", 0.9381, 2.612, 0.2501),
    ("GPT2-774M", 0.9415, 3.397, 0.3125),
    ("GPT2-1.5B", 0.9541, 4.076, 0.3750),
    ("OPT-125M", 0.9059, 2.251, 0.1110),
    ("OPT-350M", 0.9243, 5.158, 0.2778),
    ("OPT-1.3B", 0.9564, 8.680, 0.4430),
]
"""The SST-2 columns of the paper's Table 3 (Table 1 repeats the GPT-2 error-set gains). SST-2
is built from the same Rotten Tomatoes review sentences as the movie snippets used here."""


@dataclass
class Timings:
    stages: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, began: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + time.perf_counter() - began


def _store(settings: ReportSettings) -> Path:
    from heedful.files.cache import heedful_home

    return Path(settings.store) if settings.store else heedful_home() / "reproduce" / NAME


def _available(names: list[str]) -> tuple[list[str], list[str]]:
    """Zoo models that exist and are built, and notes about the others (skipped gracefully)."""
    from heedful import zoo

    found, notes = [], []
    for name in names:
        if name not in zoo.ENTRIES:
            notes.append(f"`{name}` is not in this heedful's zoo; skipped")
        elif not zoo.is_built(name):
            notes.append(f"`{name}` is in the zoo but not built (`heedful models build {name}`); skipped")
        else:
            found.append(name)
    return found, notes


@dataclass
class Plan:
    """The run's sizes and options (from the report options, ``--quick`` and the defaults)."""

    quick: bool
    methods: list[str]
    chosen: list[str]
    seed: int
    n_bench: int
    n_compare: int | None
    n_study: int
    n_rectify: int | None | str
    check: int
    steering: bool
    ratios: tuple[float, ...]
    method_options: dict[str, dict]
    study_options: dict
    store: Path
    n_seed: int = N_SEED
    n_warm: int = N_WARM
    until: Any = None
    only: str | None = None
    share: Share = EVERY
    workers: int | None = None
    stability: bool = True
    command: str = f"heedful reproduce {NAME}"
    timings: Timings = field(default_factory=Timings)

    def coperturbation(self, linearized: bool = False, lifted: bool = False) -> dict:
        extra = LIFTED if lifted else (LINEARIZED if linearized else {})
        return {**self.method_options.get("coperturbation", {}), **extra}


@dataclass
class Found:
    """What the run computed (filled stage by stage)."""

    notes: list[str]
    files: dict[str, Path] = field(default_factory=dict)
    rect: dict[str, Any] = field(default_factory=dict)
    compare: dict[str, Any] = field(default_factory=dict)
    bench: Any = None
    bench_linearized: Any = None
    uniformity: dict[str, tuple] = field(default_factory=dict)
    units: dict[str, np.ndarray] = field(default_factory=dict)
    lam_study: dict[str, np.ndarray] = field(default_factory=dict)
    layer_study: dict[str, np.ndarray] = field(default_factory=dict)
    lam_optimised: dict[str, np.ndarray] = field(default_factory=dict)
    """The lambda-order study with the optimised solver (:func:`~heedful.reproduce.coperturbation.optimised.lambda_order`)."""
    layer_optimised: dict[str, np.ndarray] = field(default_factory=dict)
    """The layer study with the optimised solver (:func:`~heedful.reproduce.coperturbation.optimised.layer_concentration`)."""
    probes: dict[int, dict] = field(default_factory=dict)
    check: dict | None = None
    seed_agreement: dict | None = None
    """The optimised solver's seed agreement at its defaults as the stability section measured it
    (``spearman`` per sentence, ``n`` dev sentences): the one seed figure the report quotes when
    it is there; else the seed check's (``n_study`` test sentences unless ``check`` says)."""
    lmap: Any = None
    sweep: Any = None
    second: dict[str, Any] = field(default_factory=dict)
    steering: Any = None
    stability: Any = None
    plausibility: dict[str, Any] = field(default_factory=dict)
    """The bench's plausibility metrics of every method against the lexicon evidence
    (:func:`~heedful.reproduce.coperturbation.focus.plausibility`)."""
    focus: dict[str, Any] = field(default_factory=dict)
    """Where each method puts its top mass: function words, thirds of the sentence
    (:func:`~heedful.reproduce.coperturbation.focus.focus`)."""


def _plan(settings: ReportSettings) -> Plan:
    opts = dict(settings.options)
    known = {
        "n_bench", "n_compare", "n_study", "n_rectify", "methods", "models", "seed", "budget", "check", "steering",
        "n_seed", "n_warm", "until", "only", "share", "workers", "stability",
    }
    unknown = sorted(set(opts) - known)
    if unknown:
        raise HeedfulError(f"the coperturbation report has no option {unknown[0]!r}", hint=f"options: {', '.join(sorted(known))}")
    quick = settings.quick
    steering = str(opts.get("steering", "on"))
    if steering not in ("on", "off"):
        raise HeedfulError(f"steering={steering!r} is not 'on' or 'off'")
    stability = str(opts.get("stability", "on"))
    if stability not in ("on", "off"):
        raise HeedfulError(f"stability={stability!r} is not 'on' or 'off'", hint="stability=off leaves the section to `--option only=stability`")
    budget = str(opts.get("budget", "report"))
    if budget not in ("report", "default"):
        raise HeedfulError(f"budget={budget!r} is not 'report' or 'default'")
    methods = option_list(opts.get("methods"), METHODS)
    if "coperturbation" not in methods:
        methods.insert(0, "coperturbation")
    if quick:
        method_options = {m: dict(QUICK["options"].get(m, {})) for m in methods}
        study_options = dict(QUICK["study"])
    elif budget == "report":
        method_options = {m: dict(BUDGET.get(m, {})) for m in methods}
        study_options = {}
    else:
        method_options, study_options = {}, {}

    def size(key: str, default: int) -> int:
        return int(opts.get(key) or (QUICK[key] if quick else default))

    stored = {k for k in ("n_compare", "n_rectify") if str(opts.get(k, "")) == "stored"}
    only = None if opts.get("only") in (None, "") else str(opts["only"])
    if only not in (None, "stability"):
        raise HeedfulError(f"unknown coperturbation section {only!r}", hint="only=stability runs the section on cost, stability and the first-order limit alone")

    return Plan(
        quick=quick, methods=methods, chosen=option_list(opts.get("models"), MODELS), seed=int(opts.get("seed", 0)),
        n_bench=size("n_bench", settings.n or N_BENCH), n_study=size("n_study", N_STUDY),
        n_compare=None if "n_compare" in stored else size("n_compare", N_COMPARE),
        n_rectify="stored" if "n_rectify" in stored else (int(opts["n_rectify"]) if opts.get("n_rectify") else (QUICK["n_rectify"] if quick else None)),
        # the seed check's default: the study's sentences, whose second seed the lambda study stores anyway
        check=int(opts["check"]) if "check" in opts else (QUICK["check"] if quick else size("n_study", N_STUDY)),
        steering=steering == "on",
        ratios=tuple(QUICK["ratios"] if quick else (*_rect().SWEEP_RATIOS, *BEYOND_SWEEP)), method_options=method_options,
        study_options=study_options, store=_store(settings), n_seed=size("n_seed", N_SEED), n_warm=size("n_warm", N_WARM),
        until=_until(opts.get("until")), only=only, share=Share.parse(opts.get("share"), "share="), workers=_workers(opts.get("workers")),
        stability=stability == "on",
        command=" ".join([f"heedful reproduce {NAME}", *(["--quick"] if quick else []), *(f"-O {k}={v}" for k, v in sorted(opts.items()))]),
    )


def _workers(value: Any) -> int | None:
    """``workers=N`` (``N >= 1``) or ``None``: the benchmarks run in this process."""
    if value in (None, ""):
        return None
    try:
        workers = int(value)
    except ValueError as exc:
        raise HeedfulError(f"workers={value!r} is not a number", hint="e.g. workers=2 (one per CPU core)") from exc
    if workers < 1:
        raise HeedfulError(f"workers={workers}: at least 1 is needed", hint="e.g. workers=2 (one per CPU core)")
    return workers


def _until(value: Any):
    """``until=HH:MM`` (UTC, today) as an aware datetime."""
    import datetime as dt

    if value in (None, ""):
        return None
    try:
        hours, minutes = (int(x) for x in str(value).split(":"))
        now = dt.datetime.now(dt.UTC)
        at = now.replace(hour=hours, minute=minutes, second=0, microsecond=0)
    except ValueError as exc:
        raise HeedfulError(f"until={value!r} is not a time HH:MM", hint="e.g. until=17:45 (UTC)") from exc
    return at  # a time already past today: no unit is started, the report summarises what is stored


def _stability(model, run: Plan, say):
    """Measure what is missing of the stability section (resumable) and summarise it."""
    from heedful.reproduce import coperturbation_stability as cs

    # a smoke run optimises for fewer steps, into a folder of its own
    folder = run.store / ("stability-quick" if run.quick else "stability")
    overrides = dict(QUICK["options"]["coperturbation"]) if run.quick else None
    say(f"cost and seed stability on {run.n_seed} dev sentences, warm start on {run.n_warm}")
    cs.measure(model, folder, run.n_seed, run.n_warm, run.until, say, run.share, overrides)
    return cs.summarise(folder, run.n_seed, run.n_warm)


def seed_agreement_of(stability: Any) -> dict | None:
    """The defaults' row of a stability summary as ``{"spearman": [...], "n": n}`` (None without one)."""
    from heedful.reproduce import coperturbation_stability as cs

    row = next((r for r in stability.settings if r["setting"] == cs.DEFAULTS), None) if stability is not None else None
    return None if row is None or not row["n"] else {"spearman": list(row["spearman"]), "n": int(row["n"])}


def _stored_seed_agreement(run: Plan) -> dict | None:
    """The stability section's seed agreement at the defaults, read from the store when a run of
    that section left its units there (nothing is computed)."""
    from heedful.reproduce import coperturbation_stability as cs

    folder = run.store / ("stability-quick" if run.quick else "stability")
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    return seed_agreement_of(cs.summarise(folder, run.n_seed, run.n_warm))


def _stability_alone(out_dir: Path, run: Plan) -> Path:
    """``only=stability``: that section alone, in ``out_dir/coperturbation-stability.md``."""
    import heedful
    from heedful.reproduce import coperturbation_stability as cs

    models, _ = _available([STABILITY_MODEL])
    if not models:
        raise HeedfulError(f"{STABILITY_MODEL} is not built", hint=f"heedful models build {STABILITY_MODEL}")
    say = _printer(True)
    began = time.perf_counter()
    found = _stability(heedful.load(STABILITY_MODEL), run, say)
    lines = [
        "# Co-perturbation: cost, stability and the first-order limit",
        "",
        f"Regenerate with `heedful reproduce coperturbation --option only=stability --option n_seed={run.n_seed} "
        f"--option n_warm={run.n_warm} --out {out_dir}` (runs are kept in the results store `{run.store}`, so a "
        "second run computes only what is missing; the full report `heedful reproduce coperturbation` includes this "
        "section).",
        "",
        *cs.section(found, run.n_seed, run.n_warm),
        f"This run took {time.perf_counter() - began:.0f} s (wall).",
        "",
    ]
    path = out_dir / f"{NAME}-stability.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _rect():
    from heedful.interest import rectify

    return rectify


def _bench(model, run: Plan, methods: list[str], n: int, options: dict, progress: bool,
           metrics: tuple[str, ...] | list[str] = ("aopc", "sufficiency"), protocol=None):
    """A bench of ``methods`` on the first ``n`` test sentences on the report's store (``protocol``:
    the ``default`` preset with 3 random seeds unless given)."""
    from heedful.evaluate import get_protocol
    from heedful.evaluate.bench import BenchSpec, run_bench

    spec = BenchSpec(
        model=model, dataset=DATASET, methods=methods, metrics=list(metrics),
        protocol=protocol or get_protocol("default", random_seeds=3), out=run.store, n=n, seed=run.seed, method_options=options,
    )
    return run_bench(spec, progress=progress, engine=_engine(model, run.workers))


def _engine(model, workers: int | None):
    """``None`` (this process) or Ray workers that each load ``model`` by its name once."""
    if workers is None:
        return None
    from heedful.evaluate.ray_engine import RayEngine
    from heedful.loading import loader

    return RayEngine(loader(model.name), workers)


def _main_model(model, name: str, run: Plan, found: Found, out_dir: Path, say, progress: bool) -> None:
    """Every study on the first model (MiniLM): the solvers compared, faithfulness, rectification,
    seeds, and the lambda / layer studies."""
    import torch

    from heedful.evaluate.report import plot_curves
    from heedful.evaluate.store import subject
    from heedful.interest import lambda_sweep, layer_map
    from heedful.interest.plots import plot_lambda_sweep, plot_layer_map
    from heedful.reproduce import coperturbation_studies as st
    from heedful.reproduce.coperturbation import focus as fc
    from heedful.reproduce.coperturbation.optimised import optimised_studies

    about = subject(model, DATASET, "test")
    ids, texts = _compare_inputs(model, run)
    began = time.perf_counter()
    say("lambda in the paper's units")
    found.units = st.lambda_units(model, texts)
    run.timings.add("lambda units", began)

    began = time.perf_counter()
    study = texts[: run.n_study]
    say(f"lambda, layer and probe studies on {len(study)} sentences (linearized)")
    found.lam_study = st.lambda_study(model, study, seed=run.seed)
    found.layer_study = st.layer_study(model, study, seed=run.seed)
    found.probes = st.probe_stability(model, study, model.adapter.num_layers, PROBE_COUNTS if not run.quick else (4, 16))
    found.files["lambda study"] = _plot_lambda_study(found.lam_study, out_dir / f"{NAME}-lambda-study.png")
    run.timings.add("lambda, layer and probe studies", began)

    torch.manual_seed(run.seed)
    began = time.perf_counter()
    say("layer x token interest map and lambda sweep of one sentence (optimised)")
    found.lmap = layer_map(model, SENTENCE, seed=run.seed, **run.study_options)
    found.files["layers"] = plot_layer_map(found.lmap, out_dir / f"{NAME}-layers.png")
    found.sweep = lambda_sweep(model, SENTENCE, list(WORDS), QUICK["lams"] if run.quick else None, seed=run.seed, **run.study_options)
    found.files["lambda"] = plot_lambda_sweep(found.sweep, out_dir / f"{NAME}-lambda.png")
    run.timings.add("one-sentence studies", began)

    began = time.perf_counter()
    say(f"faithfulness of {len(run.methods)} methods on {run.n_bench} sentences")
    found.bench = _bench(model, run, run.methods, run.n_bench, run.method_options, progress)
    found.bench_linearized = _bench(model, run, ["coperturbation"], run.n_bench, {"coperturbation": run.coperturbation(True)}, progress)
    for metric in ("aopc", "sufficiency"):
        found.files[f"{metric} {name}"] = plot_curves(found.bench, metric, out_dir / f"{NAME}-{metric}-{name}.png")
    found.uniformity = _uniformity(found.bench, run.store, model)
    found.uniformity["coperturbation (linearized)"] = _uniformity(found.bench_linearized, run.store, model)["coperturbation"]
    run.timings.add(f"faithfulness {name}", began)

    began = time.perf_counter()
    say(f"plausibility of {len(run.methods)} methods against the lexicon evidence")
    found.plausibility = fc.plausibility(
        lambda methods, n, options, metrics, protocol: _bench(model, run, methods, n, options, progress, metrics, protocol),
        run.methods, run.n_bench, run.method_options,
    )
    run.timings.add("plausibility (Figure 3)", began)
    began = time.perf_counter()
    say("function words and positions of every method's top tokens")
    found.focus = fc.focus(found.bench, run.store, model)
    run.timings.add("function words and positions (Figure 3)", began)

    began = time.perf_counter()
    say(f"optimised and linearized co-perturbation on {run.n_compare or 'the stored'} test sentences")
    _compare(model, run, found, progress)
    run.timings.add("solvers compared", began)

    began = time.perf_counter()
    say(f"rectifying {name}'s errors")
    found.rect[name] = _rectification(model, name, run, run.methods, out_dir, found)
    run.timings.add(f"rectification {name}", began)

    found.seed_agreement = _stored_seed_agreement(run)
    if run.check > 0 and found.seed_agreement is None:  # one seed figure: the stability section's when stored
        began = time.perf_counter()
        say(f"optimised co-perturbation with seeds {run.seed} and {run.seed + 1} on {run.check} sentences")
        found.check = _seed_check(model, ids, run.coperturbation(), run.store, about, run.seed, run.check)
        run.timings.add("seed check", began)

    began = time.perf_counter()
    found.lam_optimised, found.layer_optimised = optimised_studies(
        model, run.store, about, ids[: run.n_study], texts[: run.n_study], run.coperturbation(), run.seed, say,
    )
    found.files["layer study"] = _plot_layer_study(found.layer_study, out_dir / f"{NAME}-layer-study.png", found.layer_optimised)
    run.timings.add("lambda and layer studies, optimised", began)


def _compare(model, run: Plan, found: Found, progress: bool) -> None:
    """The optimised, linearized and lifted-ceiling linearized solutions on the first
    ``n_compare`` test sentences: benchmarks, rank agreement per sentence, costs."""
    from heedful.evaluate.store import ResultsStore
    from heedful.reproduce import coperturbation_studies as st

    if run.n_compare is None:
        run.n_compare = _stored_prefix(model, run)

    adam = _bench(model, run, ["coperturbation"], run.n_compare, {"coperturbation": run.coperturbation()}, progress)
    lin = _bench(model, run, ["coperturbation"], run.n_compare, {"coperturbation": run.coperturbation(True)}, progress)
    lifted = _bench(model, run, ["coperturbation"], run.n_compare, {"coperturbation": run.coperturbation(lifted=True)}, progress)
    ids, _ = _bench_ids(model, adam)
    with ResultsStore(run.store) as db:
        first = db.get_explanations(adam.runs[0].key, ids)
        second = db.get_explanations(lin.runs[0].key, ids)
        third = db.get_explanations(lifted.runs[0].key, ids)
        cost = {"adam": db.cost(adam.runs[0].key), "linearized": db.cost(lin.runs[0].key)}
    pairs = [st.rank_agreement(second[i], first[i]) for i in ids]
    pairs_lifted = [st.rank_agreement(third[i], first[i]) for i in ids]
    found.compare = {
        "n": len(ids), "adam": adam.groups["coperturbation"], "linearized": lin.groups["coperturbation"],
        "lifted": lifted.groups["coperturbation"],
        "spearman_lifted": [p[0] for p in pairs_lifted], "overlap_lifted": [p[1] for p in pairs_lifted],
        "spearman": [p[0] for p in pairs], "overlap": [p[1] for p in pairs],
        "constant": [st.constant(second[i]) for i in ids], "confidence": [first[i].prediction["probability"] for i in ids],
        "tokens": [int((~np.asarray(first[i].special)).sum()) for i in ids], "cost": cost,
    }


def _compare_inputs(model, run: Plan) -> tuple[list[str], list[str]]:
    """Ids and texts of the comparison's sentences (the first ``n_compare`` the protocol keeps)."""
    from heedful.evaluate import get_protocol
    from heedful.evaluate.bench import BenchSpec, select_inputs

    spec = BenchSpec(
        model=model, dataset=DATASET, methods=["coperturbation"], metrics=["aopc"], protocol=get_protocol("default", random_seeds=3),
        out=run.store, n=run.n_compare or N_COMPARE,
    )
    inputs, _ = select_inputs(model, spec, {})
    return [i.id for i in inputs], [i.text for i in inputs]


def _optimised_key(model, run: Plan):
    """The store key of the optimised co-perturbation's explanations (benchmark and rectification)."""
    from heedful.evaluate.store import run_key, subject

    return run_key(subject(model, DATASET, "test"), "coperturbation", {**run.coperturbation(), "seed": run.seed}, label="predicted")


def _stored_prefix(model, run: Plan) -> int:
    """``n_compare=stored``: the longest prefix of the comparison's sentences whose optimised
    explanations are in the store (at least 2)."""
    from heedful.evaluate.store import ResultsStore

    ids, _ = _compare_inputs(model, run)
    with ResultsStore(run.store) as db:
        done = db.explanation_ids(_optimised_key(model, run))
    n = next((k for k, i in enumerate(ids) if i not in done), len(ids))
    return max(2, n)


def _stored_rectify_n(model, run: Plan, limit: int) -> int:
    """``n_rectify=stored``: the most test sentences (up to ``limit``) whose errors all have an
    optimised explanation in the store (the first sentence that is an unexplained error is left out)."""
    from heedful import datasets
    from heedful.evaluate.evaluation import model_inputs
    from heedful.evaluate.store import ResultsStore

    inputs = [i for i in model_inputs(datasets.load(DATASET, "test").head(limit), model.adapter, "predicted", {}) if i.gold_class >= 0]
    predicted = _rect().classify(model, [i.text for i in inputs])
    with ResultsStore(run.store) as db:
        done = db.explanation_ids(_optimised_key(model, run))
    missing = [k for k, (i, p) in enumerate(zip(inputs, predicted, strict=True)) if p != i.gold_class and i.id not in done]
    return missing[0] if missing else limit


def _second_model(model, name: str, run: Plan, found: Found, out_dir: Path, say, progress: bool) -> None:
    """The second (larger) model: rectification with the linearized solver and random scores."""
    began = time.perf_counter()
    say(f"rectifying {name}'s errors (linearized co-perturbation and random scores)")
    found.rect[name] = _rectification(model, name, run, ["coperturbation", "random"], out_dir, found, linearized_only=True)
    run.timings.add(f"rectification {name}", began)


def _rectification(model, name: str, run: Plan, methods: list[str], out_dir: Path, found: Found, linearized_only: bool = False):
    """Rectification of ``model``'s errors: every method at the run's options, and co-perturbation
    once more with the linearized solver (listed as ``coperturbation (linearized)``)."""
    rect = _rect()
    if run.n_rectify == "stored":
        n = _stored_rectify_n(model, run, N_RECTIFY.get(name, 200)) if not linearized_only else N_RECTIFY.get(name, 200)
    else:
        n = int(run.n_rectify or N_RECTIFY.get(name, 200))
    options = {m: dict(run.method_options.get(m, {})) for m in methods}
    if linearized_only:
        options["coperturbation"] = run.coperturbation(True)
    result = rect.rectify(model, DATASET, methods, run.ratios, n=n, seed=run.seed, method_options=options, store=run.store)
    if linearized_only:
        result.methods = {("coperturbation (linearized)" if k == "coperturbation" else k): v for k, v in result.methods.items()}
    else:
        lin = rect.rectify(
            model, DATASET, ["coperturbation"], run.ratios, n=n, seed=run.seed,
            method_options={"coperturbation": run.coperturbation(True)}, store=run.store,
        )
        result.methods = {
            "coperturbation": result.methods["coperturbation"], "coperturbation (linearized)": lin.methods["coperturbation"],
            **{k: v for k, v in result.methods.items() if k != "coperturbation"},
        }
    stem = f"{NAME}-rectify-{name}"
    rect.write_csv(result, out_dir / f"{stem}.csv")
    found.files[f"rectify {name}"] = rect.plot_sweep(
        result, out_dir / f"{stem}.png", title=f"{name}: errors on {DATASET} (test) fixed by suppressing the top-r tokens"
    )
    return result


# ----------------------------------------------------------------------------- progress
def _printer(show: bool):
    from rich.console import Console

    console = Console(stderr=True)

    def say(text: str) -> None:
        if show:
            console.print(f"[bold]{NAME}[/] · {text}")

    return say


def _seed_check(model, ids: list[str], options: dict, store: Path, about, seed: int, count: int) -> dict:
    """Spearman correlation and top-20 % overlap between co-perturbation's scores with ``seed``
    (read from the store) and with ``seed + 1`` (stored too), on the first ``count`` of the
    sentences ``ids`` of ``about`` (the model on the movie snippets' test split, a
    :class:`~heedful.evaluate.store.Subject`); with the wall time per sentence of the second seed
    when it was computed here (``None`` when it came from the store)."""
    import torch
    from scipy.stats import spearmanr

    from heedful.evaluate.store import ResultsStore, run_key
    from heedful.interest.suppress import top_fraction
    from heedful.reproduce.coperturbation.optimised import explained

    ids = ids[:count]

    def key(s: int):
        return run_key(about, "coperturbation", {**options, "seed": s})

    with ResultsStore(store) as db:
        first = db.get_explanations(key(seed), ids)
        second = explained(model, db, key(seed + 1), ids, [first[i].text for i in ids], {**options, "seed": seed + 1}, f"seed {seed + 1}")
    rhos, overlaps, tokens = [], [], []
    for i in ids:
        keep = [k for k, sp in enumerate(first[i].special) if not sp]
        a, b = first[i].scores[keep], second[i].scores[keep]
        rhos.append(float(spearmanr(a, b).statistic))
        allowed = torch.ones(1, len(keep), dtype=torch.bool)
        ta = top_fraction(torch.tensor(a)[None], allowed, 0.2)
        tb = top_fraction(torch.tensor(b)[None], allowed, 0.2)
        overlaps.append(float((ta & tb).sum() / ta.sum()))
        tokens.append(len(keep))
    with ResultsStore(store) as db:
        cost = db.cost(key(seed + 1))
    seconds = cost["seconds"] / cost["examples"] if cost and cost["examples"] else None
    return {"n": len(ids), "spearman": rhos, "overlap": overlaps, "tokens": tokens, "seeds": (seed, seed + 1), "seconds": seconds}


def _store_costs(store: Path, about, methods: list[str], method_options: dict, seed: int) -> dict[str, dict]:
    """Per-method explanation cost recorded in the store for ``about`` (a
    :class:`~heedful.evaluate.store.Subject`; every run that computed explanations of these
    settings, benchmark and rectification alike): seconds and passes per sentence."""
    import heedful
    from heedful.evaluate.store import ResultsStore, run_key

    found = {}
    with ResultsStore(store) as db:
        for m in methods:
            options = dict(method_options.get(m, {}))
            if heedful.get_method(m).stochastic:
                options.setdefault("seed", seed)
            cost = db.cost(run_key(about, m, options))
            if cost and cost["examples"]:
                found[m] = {k: cost[k] / cost["examples"] for k in ("seconds", "forward", "backward")} | {"examples": cost["examples"]}
    return found


def _record_timings(store: Path, timings: Timings) -> dict[str, float]:
    """Keep, per stage, the longest wall time seen in ``store/report-timings.json`` (the run that
    computed the stage rather than reading it from the store); returns those times."""
    import json

    path = Path(store) / "report-timings.json"
    try:
        seen = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        seen = {}
    for stage, secs in timings.stages.items():
        seen[stage] = max(float(seen.get(stage, 0.0)), secs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(seen, indent=1), encoding="utf-8")
    return seen
