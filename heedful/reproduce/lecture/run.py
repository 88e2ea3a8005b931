"""Lecture report, running: the plan (sizes from ``--quick``, ``--n`` and the report options),
the unit store (one JSON file per finished unit, keyed by what it was computed from, so a rerun
or a run after Ctrl-C computes only what is missing) and the four experiments' units: edge
probes, causal traces, steering (the lecture's table and the sweep) and counterfactual tests."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heedful.errors import InputError
from heedful.reproduce import ReportSettings
from heedful.reproduce.lecture.facts import Fact, candidate_facts
from heedful.reproduce.toolkit import count_option, option_list

NAME = "lecture"
CLASSIFIER = "minilm-sentiment"
LM = "smollm2-135m"
PROBE_MODELS = (CLASSIFIER, LM)
PROPERTIES = ("pos", "dep")
LAYER_STRIDE = {LM: 3}
"""Probe every ``k``-th layer of these models (and the last): SmolLM2's 31 layers at 576 (edges:
1152) features would take most of the time budget; its expected layer is then Eq. 4 over the
layers probed, the cumulative mix growing by three blocks at a time."""
TRACE_KINDS = ("mlp", "attn")
COUNTERFACTUAL_METHODS = ("random", "saliency", "grad_x_input", "integrated_gradients", "leave_one_out", "normxlogit")
METHOD_OPTIONS = {"integrated_gradients": {"n_steps": 16}}
"""Counterfactual section: the methods tested (``random`` is the control every other method is
compared with) and the report's budget for integrated gradients."""
TABLE_POSITIVE = ("the taste is excellent!",)
TABLE_NEGATIVE = ("the desserts were very bland.",)
"""The lecture's steering table (Subramani et al. 2022): vectors are extracted for these
sentences; ``z_tonegative = mean z(negative) - mean z(positive)`` (and its opposite) is added to
the first sentence of each list with coefficients 1 and 2. The lecture's two sentences only: an
extraction costs minutes of CPU on SmolLM2 (Subramani et al. average over many sentences)."""
TABLE_COEFFICIENTS = (1.0, 2.0)
EXTRACT_TIMESTEP: int | None = None
"""Where an extracted vector is added: every position (Algorithm 1's injection timestep; Subramani
et al. compare the first timestep with all of them)."""
OPTIONS = (
    "n_probe", "n_facts", "samples", "window", "n_sweep", "coefficients", "steer_layer", "n_vector",
    "extract_steps", "n_counterfactual", "methods", "models", "seed",
)

DEFAULTS: dict[str, Any] = {
    "n_probe": 100, "n_facts": 20, "samples": 2, "window": 6, "n_sweep": 24,
    "coefficients": "-8,-4,0,4,8", "steer_layer": 6, "n_vector": 64, "extract_steps": 200, "n_counterfactual": 40,
}
"""The default run's sizes, chosen to fit 25 minutes of two CPU cores (the report states them):
``n_probe`` movie snippets (test split) probed per model, ``n_facts`` factual prompts traced
(``samples`` noise draws each, ``window`` layers restored per cell), ``n_sweep`` prompts per
coefficient of the sweep, ``n_vector`` train snippets of each sentiment for the mean-difference
vector, ``extract_steps`` Adam steps per extracted vector at most, ``n_counterfactual``
snippets explained by every method."""
QUICK: dict[str, Any] = {
    "n_probe": 12, "n_facts": 2, "samples": 1, "window": 1, "n_sweep": 4, "coefficients": "-8,0,8",
    "steer_layer": 1, "n_vector": 6, "extract_steps": 10, "n_counterfactual": 6,
}


@dataclass
class Plan:
    """The run's sizes and options (report options over ``--quick`` over the defaults)."""

    quick: bool
    sizes: dict[str, Any]
    methods: list[str]
    models: list[str]
    coefficients: list[float]
    seed: int
    store: Path
    progress: bool = True
    timings: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def count(self, key: str) -> int:
        return int(self.sizes[key])

    def timed(self, stage: str, began: tuple[float, float]) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - began[0]
        self.cpu[stage] = self.cpu.get(stage, 0.0) + time.process_time() - began[1]


def clock() -> tuple[float, float]:
    """Wall and CPU time now (for :meth:`Plan.timed`)."""
    return time.perf_counter(), time.process_time()


def plan_of(settings: ReportSettings) -> Plan:
    """The plan; an InputError naming a report option that does not exist or is malformed,
    before any work."""
    options = dict(settings.options)
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise InputError(f"the lecture report has no option {unknown[0]!r}", hint=f"options: {', '.join(OPTIONS)}")
    base = QUICK if settings.quick else DEFAULTS
    sizes = {k: v for k, v in base.items() if k != "coefficients"}
    if settings.n is not None:
        sizes["n_probe"] = settings.n
    for key in sizes:
        minimum = 0 if key == "steer_layer" else 1
        sizes[key] = count_option(options, key, sizes[key], minimum=minimum)
    raw = option_list(options.get("coefficients"), str(base["coefficients"]).split(","))
    try:
        coefficients = sorted({float(c) for c in raw})
    except ValueError:
        raise InputError(f"coefficients must be numbers, got {','.join(raw)!r}", hint="e.g. coefficients=-8,-4,0,4,8") from None
    if 0.0 not in coefficients:
        coefficients = sorted({*coefficients, 0.0})  # the unsteered baseline every claim compares with
    methods = option_list(options.get("methods"), COUNTERFACTUAL_METHODS)
    if "random" not in methods:
        methods.insert(0, "random")
    models = option_list(options.get("models"), PROBE_MODELS)
    seed = count_option(options, "seed", 0, minimum=0)
    from heedful.files.cache import heedful_home

    store = Path(settings.store) if settings.store else heedful_home() / "reproduce" / NAME
    return Plan(settings.quick, sizes, methods, models, coefficients, seed, store, settings.progress)


# ------------------------------------------------------------------------------ the unit store
class Units:
    """Finished units as JSON files in ``folder``, each named by its kind and a hash of its key
    (the model's fingerprint, the data and every setting the unit depends on), with the wall and
    CPU seconds it took when it was computed (``first``: their sums over the units this run
    used, so a rerun from the store still reports what the results cost)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.computed = 0
        self.reused = 0
        self.first: dict[str, list[float]] = {}

    def path(self, kind: str, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
        return self.folder / f"{kind}-{digest}.json"

    def get(self, kind: str, key: dict[str, Any], compute: Callable[[], Any]) -> Any:
        """The stored value of unit ``(kind, key)``, or ``compute()``'s, stored at once."""
        path = self.path(kind, key)
        if path.exists():
            self.reused += 1
        else:
            began = clock()
            value = compute()
            cost = [time.perf_counter() - began[0], time.process_time() - began[1]]
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"key": key, "cost": cost, "value": value}, default=_plain), encoding="utf-8")
            tmp.replace(path)  # a unit is there whole or not at all
            self.computed += 1
        stored = json.loads(path.read_text(encoding="utf-8"))
        total = self.first.setdefault(kind, [0.0, 0.0])
        for i, v in enumerate(stored.get("cost", [float("nan")] * 2)):
            total[i] += v
        return stored["value"]


def _plain(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__}")


def fingerprint(model) -> str:
    from heedful.fingerprint import model_fingerprint

    return model_fingerprint(model).digest


def load(name: str):
    """A zoo model by name (the tests put tiny stand-ins here)."""
    import heedful

    return heedful.load(name)


def available(name: str) -> str | None:
    """Why zoo model ``name`` cannot be used here (None: it can)."""
    from heedful import zoo

    if name not in zoo.ENTRIES:
        return f"`{name}` is not in this heedful's zoo"
    if not zoo.is_built(name):
        return f"`{name}` is not built (`heedful models build {name}`)"
    return None


# ------------------------------------------------------------------------------ 1. edge probing
def probe_unit(units: Units, model, model_name: str, prop: str, plan: Plan) -> dict:
    """Per-layer probes of ``prop`` on the first ``n_probe`` movie snippets, control task and
    the cumulative scalar-mix probes, with per-item outcomes (:func:`heedful.inside.probing.probe`)."""
    from heedful import datasets
    from heedful.inside.probing import probe

    n = plan.count("n_probe")
    stride, last = LAYER_STRIDE.get(model_name, 1), model.adapter.num_layers
    layers = sorted({*range(0, last + 1, stride), last})
    key = {"model": fingerprint(model), "property": prop, "n": n, "seed": plan.seed, "dataset": "movies/test", "v": 1}
    key |= {"layers": layers} if stride > 1 else {}  # every layer otherwise

    def compute() -> dict:
        result = probe(model, datasets.load("movies", "test", n=n), prop, layers, control=True, expected_layer=True,
                       seed=plan.seed, per_item=True)
        return result.to_dict() | {"model": model_name}

    return units.get("probe", key, compute)


# ------------------------------------------------------------------------------ 2. causal tracing
def correct_facts(units: Units, lm, plan: Plan) -> dict:
    """Every candidate fact (:func:`~heedful.reproduce.lecture.facts.candidate_facts`) with the
    model's greedy next token and whether it is the answer's first token; one batched pass."""
    import torch

    facts = candidate_facts()
    key = {"model": fingerprint(lm), "facts": [asdict(f) for f in facts], "v": 1}

    def compute() -> dict:
        adapter = lm.adapter
        predicted: list[int] = []
        for start in range(0, len(facts), 16):
            batch = adapter.encode([f.prompt for f in facts[start : start + 16]])
            anchor = adapter.anchor_positions(batch)[0].to(adapter.device)
            with torch.no_grad():
                predicted += adapter.forward(batch, anchor).logits.argmax(-1).tolist()
        wanted = [answer_token(lm, f) for f in facts]
        return {
            "facts": [asdict(f) for f in facts],
            "predicted": [lm.tokenizer.decode([p]) for p in predicted],
            "correct": [p == w for p, w in zip(predicted, wanted, strict=True)],
        }

    return units.get("facts", key, compute)


def answer_token(lm, fact: Fact) -> int:
    """The answer's first token: what the model must predict, and the output a trace reads."""
    return lm.tokenizer(fact.answer, add_special_tokens=False)["input_ids"][0]


def traced_facts(found: dict, n: int) -> list[Fact]:
    """The first ``n`` facts the model gets right."""
    return [Fact(**f) for f, ok in zip(found["facts"], found["correct"], strict=True) if ok][:n]


def trace_unit(units: Units, lm, fact: Fact, kind: str, plan: Plan) -> dict:
    """One causal trace (:func:`heedful.inside.tracing.trace`): the subject's embeddings noised
    (3 sigma, ``samples`` draws), every (layer, position) of ``kind`` restored with ``window``
    layers per cell; AtP's grid beside it."""
    from heedful.inside.tracing import trace

    samples, window = plan.count("samples"), plan.count("window")
    key = {"model": fingerprint(lm), "fact": asdict(fact), "kind": kind, "samples": samples, "window": window,
           "seed": plan.seed, "v": 1}

    def compute() -> dict:
        t = trace(lm, fact.prompt, corrupt=fact.subject, target=answer_token(lm, fact), kind=kind, window=window,
                  samples=samples, seed=plan.seed, atp=True)
        if not t.complete:
            raise KeyboardInterrupt  # an interrupted grid is not stored
        return {
            "effect": t.effect, "atp": t.atp, "columns": t.columns, "corrupted": t.corrupted,
            "clean": t.clean_score, "corrupted_score": t.corrupted_score, "spearman": t.spearman,
            "passes": t.passes,
        }

    return units.get("trace", key, compute)


# ------------------------------------------------------------------------------ 3. steering
def extract_unit(units: Units, lm, sentence: str, plan: Plan) -> dict:
    """Subramani et al.'s vector for ``sentence`` (:func:`heedful.inside.steering.extract`) at
    block ``steer_layer``, at :data:`EXTRACT_TIMESTEP`."""
    from heedful.inside.steering import extract

    layer, steps = plan.count("steer_layer"), plan.count("extract_steps")
    key = {"model": fingerprint(lm), "sentence": sentence, "layer": layer, "steps": steps, "seed": plan.seed,
           "timestep": EXTRACT_TIMESTEP, "v": 1}

    def compute() -> dict:
        e = extract(lm, sentence, layer, timestep=EXTRACT_TIMESTEP, steps=steps, seed=plan.seed)
        return {"vector": e.vector.vector.tolist(), "loss": e.loss, "steps": e.steps, "reproduced": e.reproduced,
                "decoded": e.decoded}

    return units.get("extract", key, compute)


def steering_table(units: Units, lm, judge, plan: Plan) -> dict:
    """The lecture's table with ``lm``'s outputs: each list's first sentence decoded from its own
    extracted vector plus ``k`` times the offset toward the other sentiment, judged by ``judge``."""
    import torch

    from heedful.inside.steering import Extracted, SteeringVector, transfer, unsteered

    extracted = {s: extract_unit(units, lm, s, plan) for s in (*TABLE_POSITIVE, *TABLE_NEGATIVE)}

    def mean(sentences: tuple[str, ...]) -> torch.Tensor:
        return torch.tensor([extracted[s]["vector"] for s in sentences]).mean(0)

    to_negative = mean(TABLE_NEGATIVE) - mean(TABLE_POSITIVE)
    layer = plan.count("steer_layer")
    rows = []
    for sentence, offset, toward in ((TABLE_POSITIVE[0], to_negative, "NEGATIVE"), (TABLE_NEGATIVE[0], -to_negative, "POSITIVE")):
        e = extracted[sentence]
        own = Extracted(SteeringVector(layer, torch.tensor(e["vector"]), "extracted", {"sentence": sentence, "timestep": EXTRACT_TIMESTEP}),
                        e["loss"], e["steps"], e["reproduced"], e["decoded"])
        outputs = [(0.0, e["decoded"])] + [(k, transfer(lm, own, offset, k)) for k in TABLE_COEFFICIENTS]
        judged = judge.predict([text if text.strip() else "." for _, text in outputs])
        rows.append({
            "sentence": sentence, "toward": toward, "reproduced": e["reproduced"], "unsteered": unsteered(lm, sentence),
            "outputs": [{"coefficient": k, "text": text, "label": j["label"], "probability": j.get("probability")}
                        for (k, text), j in zip(outputs, judged, strict=True)],
        })
    return {"rows": rows, "extracted": {s: {k: v for k, v in e.items() if k != "vector"} for s, e in extracted.items()}}


def sweep_units(units: Units, lm, judge, plan: Plan) -> dict:
    """The sweep (:func:`heedful.inside.sweep.sentiment_sweep`): a mean-difference vector
    (``n_vector`` positive minus ``n_vector`` negative train snippets, mean over tokens, block
    ``steer_layer``) added with each coefficient to the first ``n_sweep`` test snippets' first
    six words; success = the judge calls the continuation POSITIVE. One unit per coefficient."""
    from heedful import datasets
    from heedful.inside.steering import mean_difference
    from heedful.inside.sweep import sentiment_sweep, snippet_prompts

    layer, nv, ns = plan.count("steer_layer"), plan.count("n_vector"), plan.count("n_sweep")
    train = datasets.load("movies", "train")
    positive = [e.text for e in train if e.label == 1][:nv]
    negative = [e.text for e in train if e.label == 0][:nv]
    prompts = snippet_prompts(datasets.load("movies", "test"), words=6, n=ns)
    base = {"model": fingerprint(lm), "judge": fingerprint(judge), "layer": layer, "n_vector": nv, "prompts": prompts, "v": 1}
    vector = None
    rows = []
    for c in plan.coefficients:
        def compute(c: float = c) -> dict:
            nonlocal vector
            if vector is None:
                vector = mean_difference(lm, positive, negative, layer)
            result = sentiment_sweep(lm, judge, prompts, vector, [c], toward="POSITIVE", seed=plan.seed, shown=ns)
            row = asdict(result.rows[0])
            row["norm"] = float(vector.vector.norm())
            return row

        rows.append(units.get("sweep", base | {"coefficient": c}, compute))
    return {"rows": rows, "prompts": prompts, "layer": layer, "n_vector": nv}


# ------------------------------------------------------------------------------ 4. counterfactuals
def counterfactual_unit(units: Units, model, method: str, plan: Plan) -> dict:
    """Ye et al.'s test of ``method``'s explanations on the first ``n_counterfactual`` movie
    snippets (:func:`heedful.inside.counterfactual.counterfactual_test`, k = 1, every edit):
    every hypothesis with whether it was confirmed."""
    from heedful import datasets
    from heedful.inside.counterfactual import counterfactual_test

    n = plan.count("n_counterfactual")
    options = METHOD_OPTIONS.get(method, {})
    key = {"model": fingerprint(model), "method": method, "options": options, "n": n, "seed": plan.seed, "v": 1}

    def compute() -> dict:
        texts = [e.text for e in datasets.load("movies", "test", n=n)]
        report = counterfactual_test(model, texts, [method], seed=plan.seed, method_options={method: options})
        return {"hypotheses": [h.__dict__ for h in report.hypotheses], "texts": report.texts, "k": report.k,
                "options": report.options}

    return units.get("counterfactual", key, compute)
