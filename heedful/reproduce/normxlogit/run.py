"""NormXLogit report, running: the cases and their bench runs (Experiment 1), the agreement pairs'
layer-wise alignment and logit lens (Experiment 2, cached), and the cost measurements (Tables
4-5)."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from heedful.reproduce import ReportSettings
from heedful.reproduce.normxlogit.statistics import LENS_ROWS, lens_summary, per_layer_intervals

PAPER = "Abbasi et al., *NormXLogit: The Head-on-Top Never Lies*"
METHODS = (
    "random", "saliency", "grad_x_input", "integrated_gradients", "decompx", "value_zeroing", "embedding_norm", "logat",
    "normxlogit",
)
GRADIENT_METHODS = ("saliency", "grad_x_input", "integrated_gradients")
NAMES = {
    "random": "Random",
    "saliency": "Gradient norm",
    "grad_x_input": "Gradient × input",
    "integrated_gradients": "Integrated gradients",
    "decompx": "DecompX",
    "value_zeroing": "Value Zeroing (rollout)",
    "embedding_norm": "Embedding norm",
    "logat": "LogAt",
    "normxlogit": "NormXLogit",
}

# The paper's Table 1 (AOPC, STS-B Pearson) and Table 3 (accuracy): (Llama 2, BERT); None where the
# paper has no number (DecompX is "N/A" for Llama 2; Value Zeroing appears only in a figure, A.2 Fig. 6).
PaperValue = tuple[float | None, float | None]
PAPER_SST2_AOPC: dict[str, PaperValue] = {
    "random": (0.256, 0.245), "saliency": (0.216, 0.331), "grad_x_input": (0.236, 0.339),
    "integrated_gradients": (0.220, 0.367), "decompx": (None, 0.574), "value_zeroing": (None, None),
    "embedding_norm": (0.299, 0.311), "logat": (0.341, 0.364), "normxlogit": (0.341, 0.423),
}
PAPER_SST2_ACCURACY: dict[str, PaperValue] = {
    "random": (0.793, 0.839), "saliency": (0.844, 0.764), "grad_x_input": (0.818, 0.758),
    "integrated_gradients": (0.822, 0.726), "decompx": (None, 0.527), "value_zeroing": (None, None),
    "embedding_norm": (0.743, 0.775), "logat": (0.768, 0.757), "normxlogit": (0.720, 0.684),
}
PAPER_STSB_PEARSON: dict[str, PaperValue] = {
    "random": (0.283, 0.457), "saliency": (0.351, 0.374), "grad_x_input": (0.255, 0.358),
    "integrated_gradients": (0.237, 0.370), "decompx": (None, 0.336), "value_zeroing": (None, None),
    "embedding_norm": (0.251, 0.321), "logat": (0.167, 0.313), "normxlogit": (0.233, 0.281),
}
LLAMA, BERT = 0, 1


@dataclass(frozen=True)
class Variant:
    """An extra row of Experiment 1: ``method`` run with other ``options`` (its own key in the
    store), shown as ``name``; ``regression`` only on the regression case."""

    key: str
    method: str
    options: tuple[tuple[str, Any], ...]
    name: str
    regression: bool = False


VARIANTS = (
    Variant("grad_x_input_signed", "grad_x_input", (("aggregate", "sum"),), "Gradient × input (signed sum)"),
    Variant("integrated_gradients_signed", "integrated_gradients", (("aggregate", "sum"),), "Integrated gradients (signed sum)"),
    Variant("logat_far", "logat", (("regression_rank", "far"),), "LogAt (Eq. 8 as printed: farthest first)", True),
    Variant("normxlogit_far", "normxlogit", (("regression_rank", "far"),), "NormXLogit (Eq. 8 as printed: farthest first)", True),
)
"""The signed gradient baselines beside the paper's L1-aggregated ones, and on the regression case
Eq. 8 with the printed sign beside heedful's nearest-first reading (``regression_rank``)."""
NAMES.update({v.key: v.name for v in VARIANTS})
GRADIENT_ROWS = GRADIENT_METHODS + ("grad_x_input_signed", "integrated_gradients_signed")

DEFAULT_N = 500
DEFAULT_N_REGRESSION = 200
DEFAULT_N_DECODER = 200
DEFAULT_IG_STEPS_DECODER = 8
DEFAULT_RANDOM_SEEDS = 2
QUICK_N = 6
DEFAULT_IG_STEPS = 20
QUICK_IG_STEPS = 4
DEFAULT_N_AGREEMENT = 500
QUICK_N_AGREEMENT = 12
DECODER_CLASSIFIER = "smollm2-sentiment"
LM = "smollm2-135m"
RANDOM_SEEDS_EXP2 = 5


@dataclass(frozen=True)
class Case:
    """One Experiment 1 table: a zoo model on the movie snippets and the paper column beside it."""

    key: str
    model: str
    metrics: tuple[str, ...]
    paper: dict[str, dict[str, PaperValue]]  # metric -> method -> (Llama 2, BERT)
    column: int
    column_name: str
    decoder: bool = False


CASES = (
    Case("minilm-sentiment", "minilm-sentiment", ("aopc", "accuracy"),
         {"aopc": PAPER_SST2_AOPC, "accuracy": PAPER_SST2_ACCURACY}, BERT, "BERT, SST-2"),
    Case(DECODER_CLASSIFIER, DECODER_CLASSIFIER, ("aopc", "accuracy"),
         {"aopc": PAPER_SST2_AOPC, "accuracy": PAPER_SST2_ACCURACY}, LLAMA, "Llama 2, SST-2", decoder=True),
    Case("minilm-sentiment-regression", "minilm-sentiment-regression", ("pearson", "pearson_drop"),
         {"pearson": PAPER_STSB_PEARSON}, BERT, "BERT, STS-B"),
)


# ---------------------------------------------------------------------------- settings
def store_dir(settings: ReportSettings) -> Path:
    """The results store of this report: ``settings.store`` or ``heedful_home()/reproduce/normxlogit``."""
    from heedful.files.cache import heedful_home

    return Path(settings.store) if settings.store else heedful_home() / "reproduce" / "normxlogit"


def gradient_aggregation() -> str | None:
    """``"l1"`` when saliency, gradient x input and integrated gradients all take an
    ``aggregate`` option with that choice (the paper aggregates gradients with the L1 norm), else
    ``None`` (each method's default aggregation)."""
    from heedful.attribution import get_method

    for name in GRADIENT_METHODS:
        info = get_method(name, None)
        if not info.takes("aggregate") or "l1" not in (info.option("aggregate").choices or ()):
            return None
    return "l1"


def _aggregation_note(aggregate: str | None) -> str:
    if aggregate:
        return (f"gradients aggregated over the embedding dimension with `aggregate=\"{aggregate}\"` "
                "(the L1 norm, as the paper's first version states) for all three gradient methods")
    return ("heedful's default aggregations: gradient norm = L2 norm of the gradient, gradient × input and "
            "integrated gradients = signed sum over the embedding dimension (the `aggregate` option for the "
            "paper's L1 aggregation was not available when this report ran)")


def _model_available(name: str) -> tuple[bool, str]:
    from heedful import zoo

    if name not in zoo.ENTRIES:
        return False, f"`{name}` is not in the zoo of this heedful version"
    if not zoo.is_built(name):
        return False, f"`{name}` is in the zoo but not built (`heedful.zoo.ensure_built(\"{name}\")` builds it)"
    return True, ""


# ---------------------------------------------------------------------------- Experiment 1
def run_case(case: Case, settings: ReportSettings, out_dir: Path, n: int, ig_steps: int, aggregate: str | None,
             batch_size: int, random_seeds: int) -> tuple[Any, float, list[Path]]:
    """Bench of one case; returns the result, wall seconds and the plots written."""
    import heedful
    from heedful.evaluate.bench import BenchSpec, run_bench
    from heedful.evaluate.protocol import get_protocol
    from heedful.evaluate.report import plot_curves

    options: dict[str, dict[str, Any]] = {"integrated_gradients": {"n_steps": ig_steps}}
    if "pearson" in case.metrics:
        # the paper's DecompX on STS-B: "in the absence of a classification head, we applied the
        # norm to the decomposed vectors obtained from the final layer"
        options["decompx"] = {"include_classifier": False}
    if aggregate:
        for name in GRADIENT_METHODS:
            options.setdefault(name, {})["aggregate"] = aggregate
    model = heedful.load(case.model)
    protocol = get_protocol("normxlogit").with_(name="normxlogit", random_seeds=random_seeds)

    def bench(methods: list[str], method_options: dict[str, dict[str, Any]]):
        spec = BenchSpec(
            model=model, dataset="movies", split="test", methods=methods, metrics=list(case.metrics),
            protocol=protocol, out=store_dir(settings), n=n, batch_size=batch_size, method_options=method_options,
        )
        return run_bench(spec, progress=settings.progress)

    began = time.perf_counter()
    result = bench(list(METHODS), options)
    variants = [v for v in VARIANTS if not v.regression or "pearson" in case.metrics]
    if variants:  # one more bench: a method appears once per bench, so its variants run beside it
        extra = bench(
            [v.method for v in variants],
            {v.method: {**options.get(v.method, {}), **dict(v.options)} for v in variants},
        )
        result.groups.update({v.key: extra.groups[v.method] for v in variants})
        result.runs += [replace(r, group=v.key) for v in variants for r in extra.runs if r.group == v.method]
    wall = time.perf_counter() - began
    plots = []
    stem = "normxlogit-quick-" if settings.quick else "normxlogit-"
    shown = replace(result, groups={NAMES[k] if k in NAMES and k not in METHODS else k: g for k, g in result.groups.items()})
    for metric in case.metrics:
        path = out_dir / f"{stem}{case.key}-{metric.replace('_', '-')}.png"
        plots.append(plot_curves(shown, metric, path))
    return result, wall, plots


# ---------------------------------------------------------------------------- Experiment 2
EXP2_METHODS = (
    "logat_target", "logat_foil", "logat_plural", "normxlogit", "globenc", "alti", "value_zeroing", "embedding_norm",
    "random",
)
EXP2_NAMES = {
    "logat_target": "LogAt(target)",
    "logat_foil": "LogAt(foil)",
    "logat_plural": "LogAt(plural)",
    "normxlogit": "NormXLogit",
    "globenc": "GlobEnc¬",
    "alti": "ALTI¬",
    "value_zeroing": "Value Zeroing¬",
    "embedding_norm": "Embedding norm",
    "random": "Random",
}
PER_LAYER = {"rollout": False, "layerwise": True}
"""The paper's Experiment 2 takes GlobEnc's, ALTI's and Value Zeroing's per-layer matrices without
rollout (its "GlobEnc¬" and "ALTI¬")."""
VERSUS = ("globenc", "alti", "value_zeroing")
"""The per-layer baselines the paper finds NormXLogit ahead of "across almost all layers"."""
PLURAL = "plural"
"""The word whose LogAt the paper's appendix A.3 finds best aligned with number-agreement evidence."""


@dataclass
class Alignment:
    """Per-layer alignment on ``n`` pairs: ``dot`` / ``ap`` ``[method, layer]`` means (``*_std``
    over examples; the random row: mean of the seeds' means, std over seeds), per-paradigm means
    of the best layer, and what was skipped."""

    n: int
    layers: int
    dot: np.ndarray
    ap: np.ndarray
    dot_std: np.ndarray
    ap_std: np.ndarray
    paradigms: dict[str, dict[str, np.ndarray]]
    skipped: dict[str, int]
    seconds: float
    model_name: str
    dot_low: np.ndarray | None = None
    dot_high: np.ndarray | None = None
    ap_low: np.ndarray | None = None
    ap_high: np.ndarray | None = None
    lens: dict[str, np.ndarray] | None = None
    """The logit lens at the anchor per layer (:data:`LENS_ROWS`, each ``[layer]``; ``*_low`` /
    ``*_high``: 95 % bootstrap intervals), and ``evidence_first``: share of pairs whose first
    token is evidence."""
    ap_change: np.ndarray | None = None
    """``[method, 3]``: AP at the last layer minus AP at the first, paired over the pairs, with its
    95 % paired bootstrap interval (estimate, low, high)."""
    versus: dict[str, np.ndarray] | None = None
    """``"dot"`` / ``"ap"`` -> ``[3, layer, 3]``: NormXLogit minus each of :data:`VERSUS` at every
    layer, paired over the pairs, with its 95 % paired bootstrap interval."""
    without_anchor: Alignment | None = None
    """The same pairs with the anchor position (the last prefix token) taken out of both the
    scores and the evidence (:func:`without_position`); pairs left with no evidence, or only
    evidence, drop out (its ``n`` and per-paradigm ``n`` count the rest). No lens of its own."""


def lens_quality(adapter, hidden_states: tuple, anchor, targets, foils) -> dict[str, np.ndarray]:
    """The logit lens at the anchors: per example and layer 1..L (``[B, L]`` each) whether the
    target's logit beats the foil's, KL(final || layer) and log10(1 + rank of the target);
    ``hidden_states``: L + 1 tensors ``[B, N, D]``, ``anchor``/``targets``/``foils`` ``[B]``."""
    import torch

    rows = torch.arange(anchor.shape[0])
    last = len(hidden_states) - 1
    at = torch.stack([hidden_states[layer][rows, anchor] for layer in range(1, last + 1)], dim=1)  # [B, L, D]
    bsz, layers, dim = at.shape
    logp = torch.cat(
        [adapter.head_at_layer(at[:, k], k + 1).float().log_softmax(-1)[:, None] for k in range(layers)], dim=1
    )  # [B, L, V]
    final = logp[:, -1:]
    target = logp.gather(2, targets[:, None, None].expand(bsz, layers, 1))[..., 0]
    foil = logp.gather(2, foils[:, None, None].expand(bsz, layers, 1))[..., 0]
    rank = (logp > target[..., None]).sum(-1)
    return {
        "correct": (target > foil).double().numpy(),
        "kl": (final.exp() * (final - logp)).sum(-1).double().numpy(),
        "log_rank": torch.log10(1.0 + rank.double()).numpy(),
    }


def _agreement_data(n: int):
    """The causal agreement pairs :func:`_agreement_inputs` picks the first ``n`` usable ones from."""
    from heedful import datasets

    return datasets.load("agreement", "test", max(2 * n, 50), causal=True)


def _agreement_inputs(adapter, data, n: int, skipped: dict[str, int]):
    """The first ``n`` pairs of ``data`` (:func:`_agreement_data`) whose target and foil are
    single tokens, with foil ids."""
    from heedful.evaluate.evaluation import lm_token, model_inputs

    by_id = {e.id: e for e in data}
    inputs = model_inputs(data, adapter, "predicted", skipped, "target")
    found = []
    for item in inputs:
        foil = lm_token(adapter, by_id[item.id].foil)
        if foil is None:
            skipped["foil word is not one known token"] = skipped.get("foil word is not one known token", 0) + 1
            continue
        found.append((item, foil, by_id[item.id].meta["paradigm"]))
    return found[:n]


def alignment_scores(
    model, items, batch_size: int
) -> tuple[dict[str, list[np.ndarray]], list[np.ndarray], dict[str, list[np.ndarray]], list[int]]:
    """Per example: scores ``[L, N]`` (``[N]`` for layer-free methods, ``[S, N]`` for the random
    seeds) of every Experiment 2 method, the evidence vector ``[N]``, the logit lens's
    quality ``[L]`` per :data:`LENS_ROWS` row, and the anchor's position (the last prefix token,
    whose state predicts the target).

    One forward pass with hidden states per batch; LogAt / NormXLogit read every layer's
    hidden states through the head (logit lens), the registered method functions doing the work.
    """
    import torch

    from heedful.attribution import get_method
    from heedful.datasets.evidence import token_evidence
    from heedful.engine.targets import Columns
    from heedful.evaluate.evaluation import lm_token

    adapter = model.adapter
    method = {name: get_method(name, adapter.task) for name in EXP2_REGISTERED}
    plural = lm_token(adapter, PLURAL)
    scores: dict[str, list[np.ndarray]] = {m: [] for m in EXP2_METHODS}
    evidence: list[np.ndarray] = []
    lens: dict[str, list[np.ndarray]] = {k: [] for k in LENS_ROWS}
    anchors: list[int] = []
    for start in range(0, len(items), batch_size):
        part = items[start : start + batch_size]
        targets = [int(i.target.value) for i, _, _ in part]
        columns = Columns(tuple((t,) for t in targets), (1.0,), tuple(adapter.output_name(t) for t in targets))
        on_target = model.prepare([i.text for i, _, _ in part], columns, hidden_states=True)
        batch = on_target.batch
        foils = torch.tensor([[f] for _, f, _ in part], dtype=torch.long)
        on_foil = replace(on_target, target=replace(on_target.target, classes=foils))
        with torch.no_grad():
            found = {
                "logat_target": method["logat"](on_target, layerwise=True),
                "logat_foil": method["logat"](on_foil, layerwise=True),
                "normxlogit": method["normxlogit"](on_target, layerwise=True),
                "globenc": method["globenc"](on_target, **PER_LAYER),
                "alti": method["alti"](on_target, **PER_LAYER),
                "value_zeroing": method["value_zeroing"](on_target, **PER_LAYER),
                "embedding_norm": method["embedding_norm"](on_target),
                "random": torch.stack([method["random"](on_target, seed=s) for s in range(RANDOM_SEEDS_EXP2)], dim=1),
            }
            if plural is not None:
                on_plural = replace(on_target, target=replace(on_target.target, classes=torch.full_like(foils, plural)))
                found["logat_plural"] = method["logat"](on_plural, layerwise=True)
            hidden = on_target.reference_with(hidden_states=True).hidden_states
            quality = lens_quality(adapter, hidden, on_target.anchor, torch.tensor(targets), foils[:, 0])
            norms = torch.stack(hidden[1:], dim=1).float().norm(dim=-1)  # [B, L, N]
        for b, (item, _, _) in enumerate(part):
            n = int(batch.lengths[b])
            for name, tensor in found.items():
                scores[name].append(tensor[b, ..., :n].float().numpy().astype(np.float64))
            evidence.append(token_evidence(batch.offsets[b][:n], batch.sequence_ids[b][:n], item.evidence_spans))
            anchors.append(int(on_target.anchor[b]))
            for key, values in quality.items():
                lens[key].append(values[b])
            lens["top_first"].append((scores["logat_target"][-1].argmax(axis=-1) == 0).astype(np.float64))
            lens["first_norm"].append((norms[b, :, 0] / norms[b, :, 1:n].median(dim=-1).values).double().numpy()
                                      if n > 1 else np.full(norms.shape[1], np.nan))
    return scores, evidence, lens, anchors


ALIGNMENT_VERSION = 5  # bump when the alignment computation changes, so cached results are redone
EXP2_REGISTERED = ("logat", "normxlogit", "globenc", "alti", "value_zeroing", "embedding_norm", "random")
"""The registered methods whose outputs the alignment is computed from."""


def _alignment_cache(settings: ReportSettings, model, data, n: int) -> Path:
    """Where the alignment of ``model`` on ``n`` pairs of ``data`` is kept: named by the model's
    label and keyed by its fingerprint, the pairs' content and the methods' versions."""
    import hashlib

    from heedful.attribution import get_method
    from heedful.engine.options import canonical_json
    from heedful.fingerprint import DIGITS, dataset_fingerprint, model_fingerprint

    identity = {
        "model": model_fingerprint(model).digest,
        "data": dataset_fingerprint(data),
        "methods": {name: get_method(name).version for name in EXP2_REGISTERED},
    }
    digest = hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:DIGITS]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.name)
    return store_dir(settings) / f"alignment-v{ALIGNMENT_VERSION}-{safe}-{digest}-n{n}.json"


def _alignment_json(al: Alignment) -> dict[str, Any]:
    def listed(d: dict | None) -> dict | None:
        return None if d is None else {k: np.asarray(v).tolist() for k, v in d.items()}

    nested = ("paradigms", "lens", "versus", "without_anchor")
    data = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in vars(al).items() if k not in nested}
    data["paradigms"] = {p: listed(d) for p, d in al.paradigms.items()}
    data["lens"], data["versus"] = listed(al.lens), listed(al.versus)
    data["without_anchor"] = None if al.without_anchor is None else _alignment_json(al.without_anchor)
    return data


def _alignment_of_json(data: dict[str, Any]) -> Alignment:
    def arrays(d: dict | None) -> dict[str, np.ndarray] | None:
        return None if d is None else {k: np.array(v, dtype=float) for k, v in d.items()}

    keys = ("dot", "ap", "dot_std", "ap_std", "dot_low", "dot_high", "ap_low", "ap_high", "ap_change")
    found = {k: None if data.get(k) is None else np.array(data[k], dtype=float) for k in keys}
    paradigms = {p: arrays(d) for p, d in data["paradigms"].items()}
    inner = data.get("without_anchor")
    return Alignment(n=data["n"], layers=data["layers"], paradigms=paradigms, skipped=data["skipped"],
                     seconds=data["seconds"], model_name=data["model_name"], lens=arrays(data.get("lens")),
                     versus=arrays(data.get("versus")), without_anchor=None if inner is None else _alignment_of_json(inner),
                     **found)


def _save_alignment(al: Alignment, path: Path) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_alignment_json(al)), encoding="utf-8")


def _load_alignment(path: Path) -> Alignment | None:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _alignment_of_json(data)


def without_position(values: np.ndarray, position: int) -> np.ndarray:
    """``values`` ``[..., N]`` with index ``position`` of the last axis taken out -> ``[..., N - 1]``."""
    return np.delete(values, position, axis=-1)


def alignment_values(
    scores: dict[str, list[np.ndarray]], evidence: list[np.ndarray], anchors: list[int] | None, dot_normalization: str
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per pair, method and layer: the dot product and average precision of the scores against
    the evidence (``{"dot", "ap"}`` -> ``[method, layer, pair]``, NaN where a pair has no evidence
    or only evidence, or a method no scores) and the random seeds' values (``[seed, pair]``).
    ``anchors``: each pair's anchor position, taken out of both scores and evidence first
    (:func:`without_position`); ``None`` keeps every position."""
    from heedful.evaluate.metrics import average_precision_rows, dot_product_rows

    layers = scores["logat_target"][0].shape[0]
    pairs = len(evidence)
    fns = {"dot": lambda s, e: dot_product_rows(s, e, dot_normalization), "ap": average_precision_rows}
    per_example = {k: np.full((len(EXP2_METHODS), layers, pairs), np.nan) for k in fns}
    seed_values = {k: np.full((RANDOM_SEEDS_EXP2, pairs), np.nan) for k in fns}
    for j, ev in enumerate(evidence):
        if anchors is not None:
            ev = without_position(ev, anchors[j])
        if not ev.any() or ev.all():
            continue
        for r, name in enumerate(EXP2_METHODS):
            if not scores[name]:  # LogAt(plural) when the word is not one token of this vocabulary
                continue
            s = scores[name][j] if anchors is None else without_position(scores[name][j], anchors[j])
            rows = s[None] if s.ndim == 1 else s
            for key, fn in fns.items():
                values = fn(rows, ev)
                if name == "random":
                    seed_values[key][:, j] = values
                    per_example[key][r, :, j] = values.mean()
                else:
                    per_example[key][r, :, j] = values
    return per_example, seed_values


def summarise_alignment(per_example: dict[str, np.ndarray], seed_values: dict[str, np.ndarray], labels: list[str],
                        **fields: Any) -> Alignment:
    """An :class:`Alignment` from :func:`alignment_values`'s per-pair values (``labels``: each
    pair's paradigm): means, std over pairs (random: over its seeds' means), 95 % intervals per
    method and layer (overall and per paradigm), the paired last-minus-first-layer change of AP and
    NormXLogit's paired differences from :data:`VERSUS`; ``fields`` fill the rest (``skipped``,
    ``seconds``, ``model_name``, ...)."""
    from heedful.evaluate.intervals import bootstrap_paired_difference

    usable = np.isfinite(per_example["ap"]).any(axis=(0, 1))  # [pair]
    layers = per_example["ap"].shape[1]
    r = EXP2_METHODS.index("random")
    mean = {k: np.nanmean(v, axis=2) for k, v in per_example.items()}
    std = {k: np.nanstd(v, axis=2, ddof=1) for k, v in per_example.items()}
    for key, values in seed_values.items():
        std[key][r, :] = np.nanstd(np.nanmean(values, axis=1), ddof=1)
    bounds = {k: per_layer_intervals(v) for k, v in per_example.items()}
    paradigms: dict[str, dict[str, np.ndarray]] = {}
    tags = np.array(labels)
    for paradigm in dict.fromkeys(labels):
        chosen = (tags == paradigm) & usable
        found = paradigms[paradigm] = {"n": np.array(int(chosen.sum()))}
        for key, values in per_example.items():
            if not chosen.any():  # every pair of the paradigm dropped out
                found[key] = found[f"{key}_low"] = found[f"{key}_high"] = np.full(values.shape[:2], np.nan)
                continue
            found[key] = np.nanmean(values[:, :, chosen], axis=2)
            found[f"{key}_low"], found[f"{key}_high"] = per_layer_intervals(values[:, :, chosen])
    nx = EXP2_METHODS.index("normxlogit")
    versus = {key: np.array([[bootstrap_paired_difference(values[nx, k], values[EXP2_METHODS.index(m), k])
                              for k in range(layers)] for m in VERSUS]) for key, values in per_example.items()}
    ap_change = np.array([bootstrap_paired_difference(row[-1], row[0]) for row in per_example["ap"]])
    return Alignment(
        n=int(usable.sum()), layers=layers, dot=mean["dot"], ap=mean["ap"], dot_std=std["dot"], ap_std=std["ap"],
        paradigms=paradigms, dot_low=bounds["dot"][0], dot_high=bounds["dot"][1], ap_low=bounds["ap"][0],
        ap_high=bounds["ap"][1], ap_change=ap_change, versus=versus, **fields,
    )


def run_alignment(settings: ReportSettings, n: int, batch_size: int) -> Alignment:
    """Experiment 2 analogue on ``n`` agreement pairs with the causal LM (kept in the results
    store folder, so a rerun reads it back)."""
    import heedful
    from heedful.evaluate.protocol import get_protocol

    began = time.perf_counter()
    model = heedful.load(LM)
    data = _agreement_data(n)
    cache = _alignment_cache(settings, model, data, n)
    found = _load_alignment(cache)
    if found is not None:
        return found
    protocol = get_protocol("normxlogit")
    skipped: dict[str, int] = {}
    items = _agreement_inputs(model.adapter, data, n, skipped)
    scores, evidence, lens, anchors = alignment_scores(model, items, batch_size)
    labels = [p for _, _, p in items]
    readings = {}
    for name, dropped in (("with", None), ("without", anchors)):
        readings[name] = summarise_alignment(*alignment_values(scores, evidence, dropped, protocol.dot_normalization),
                                             labels, skipped=skipped, seconds=0.0, model_name=LM)
    al = replace(readings["with"], seconds=time.perf_counter() - began, lens=lens_summary(lens, evidence),
                 without_anchor=readings["without"])
    _save_alignment(al, cache)
    return al


# ---------------------------------------------------------------------------- cost (Tables 4-5)
TIMING_MODEL = "minilm-sentiment"
TIMING_METHODS = (
    "saliency", "grad_x_input", "integrated_gradients", "decompx", "alti", "globenc", "value_zeroing", "normxlogit",
)
TIMING_LENGTHS = (40, 120, 360, 512)
QUICK_TIMING_LENGTHS = (40,)
COST_NAMES = {**NAMES, "alti": "ALTI", "globenc": "GlobEnc", "value_zeroing": "Value Zeroing"}
# The paper's Table 4: seconds per example on BERT-base (GPU), five runs averaged.
PAPER_TIMING = {
    40: {"saliency": 0.77, "grad_x_input": 0.80, "integrated_gradients": 0.82, "decompx": 0.39, "normxlogit": 0.36},
    120: {"saliency": 0.77, "grad_x_input": 0.81, "integrated_gradients": 0.96, "decompx": 0.38, "normxlogit": 0.36},
    360: {"saliency": 0.76, "grad_x_input": 0.80, "integrated_gradients": 1.47, "decompx": 0.99, "normxlogit": 0.38},
    512: {"saliency": 0.78, "grad_x_input": 0.80, "integrated_gradients": 1.79, "decompx": 2.36, "normxlogit": 0.36},
}


@dataclass
class Timing:
    """Seconds (median over ``repeats[length]`` runs) and peak resident-memory increase (MB) of
    explaining one input of each length with each method: ``{(method, length): value}``."""

    model_name: str
    ig_steps: int
    seconds: dict[tuple[str, int], float]
    peak_mb: dict[tuple[str, int], float]
    repeats: dict[int, int]
    tokens: dict[int, int]


def timing_text(model, length: int) -> str:
    """Movie snippets of the test split joined until the text has at least ``length`` tokens
    (explaining it cut to ``length`` tokens gives an input of exactly that length)."""
    from heedful import datasets

    parts: list[str] = []
    for example in datasets.load("movies", "test", 4 * length):
        parts.append(example.text)
        if len(model.tokenizer(" ".join(parts), truncation=True, max_length=length)["input_ids"]) >= length:
            break
    return " ".join(parts)


def run_timing(ig_steps: int, quick: bool) -> Timing:
    """One example of each length explained by each method, alone (batch of one), after a
    warm-up run of every method; peak memory from the process's peak-RSS mark reset before each
    run (:func:`heedful.engine.memory.reset_peak_rss`)."""
    import statistics

    import heedful
    from heedful.engine.memory import current_rss, peak_rss, reset_peak_rss

    model = heedful.load(TIMING_MODEL)
    lengths = QUICK_TIMING_LENGTHS if quick else TIMING_LENGTHS
    options = {"integrated_gradients": {"n_steps": ig_steps}}
    seconds: dict[tuple[str, int], float] = {}
    peak: dict[tuple[str, int], float] = {}
    repeats = {length: 1 if quick or length > 120 else 3 for length in lengths}
    tokens: dict[int, int] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*longer than .* tokens were truncated")  # cut on purpose
        texts = {length: timing_text(model, length) for length in lengths}
        for method in TIMING_METHODS:  # warm-up: first-call allocations and lazy imports
            model.explain(texts[lengths[0]], method, max_length=lengths[0], **options.get(method, {}))
        for length in lengths:
            for method in TIMING_METHODS:
                runs, peaks = [], []
                for _ in range(repeats[length]):
                    reset_peak_rss()
                    base = current_rss()
                    began = time.perf_counter()
                    explained = model.explain(texts[length], method, max_length=length, **options.get(method, {}))
                    runs.append(time.perf_counter() - began)
                    peaks.append((peak_rss() - base) / 2**20)
                    tokens[length] = len(explained.tokens)
                seconds[(method, length)] = statistics.median(runs)
                peak[(method, length)] = max(peaks)
    return Timing(model.name, ig_steps, seconds, peak, repeats, tokens)
