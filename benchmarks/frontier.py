"""Faithfulness against cost of every registered sequence-classification method: the frontier.

On the first ``--n`` held-out sentences of the movies test split and ``minilm-sentiment`` this
script

1. explains every sentence with every method that claims classification and runs on the model
   (context methods, which rank sources of a prompt, are left out), at its defaults, timing
   each; its **cost** is the forward-pass equivalents per example its cost model gives
   (:func:`heedful.engine.workload.passes`; a backward counts two, Kaplan et al. 2020),
   averaged over the sentences;
2. scores every explanation under protocol ``default`` (NormXLogit's: ratios 0..1, AOPC and
   sufficiency averaged over 10..90 %) with each removal operator of a cross-operator
   evaluation (:data:`heedful.evaluate.operators.CROSS_OPERATORS`: deletion, ``[MASK]``, and a
   corpus word of the same part of speech), soft comprehensiveness / sufficiency (Zhao &
   Aletras 2023) and, when ``minilm-sentiment-ffidelity`` is built, F-Fidelity's FFid+ / FFid-
   (Zheng et al. 2024; :mod:`heedful.evaluate.ffidelity`);
3. gives every mean its 95 % percentile bootstrap interval over sentences, and every comparison
   of two methods (all are scored on the same sentences) the paired interval of their
   per-sentence difference (:mod:`heedful.evaluate.intervals`);
4. marks the Pareto front of AOPC (``[MASK]``, the model's own removal) against cost, evaluates
   the targets of the frontier issue and prints each as holds / does not hold with the closest
   method;
5. writes the table, the targets and the plot (``--plot``) to ``--out`` and the front to
   ``heedful/frontier.json`` (read by ``heedful methods`` and the page's method picker), in one run.

``smollm2-sentiment`` (200 sentences at full size) is measured too when it is built; otherwise
the script says so and skips it (``heedful models build smollm2-sentiment``).
ROAR (retraining without each method's top tokens, Hooker et al. 2019) costs a retrain per method,
fraction and seed, so ``benchmarks/roar.py`` measures it apart; the file links its results.

    python benchmarks/frontier.py [--n 500] [--methods NAME,...] [--skip NAME,...]
        [--max-cost 3000] [--samples 4] [--threads 2] [--out docs/results/frontier.md]

``--max-cost`` leaves out methods whose cost model exceeds that many forward-pass equivalents
per example (listed in the file); ``--max-cost inf`` runs all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _shared import command_line, library_versions, write_results  # noqa: E402  (benchmarks/ is the script's folder)

import heedful
from heedful import datasets
from heedful.engine.workload import passes
from heedful.errors import HeedfulError
from heedful.evaluate import evaluate, get_protocol
from heedful.evaluate.evaluation import model_inputs
from heedful.evaluate.ffidelity import FFID_BETA, f_fidelity
from heedful.evaluate.intervals import bootstrap_mean, bootstrap_paired_difference
from heedful.evaluate.operators import CROSS_OPERATORS, replacement_operator
from heedful.frontier import FRONTIER
from heedful.registry import registered
from heedful.zoo import is_built

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROTOCOL = "default"
FFID_MODEL = "minilm-sentiment-ffidelity"
MODELS = {"minilm-sentiment": 500, "smollm2-sentiment": 200}
"""Models measured and their full size (sentences)."""
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
AOPC_GAIN = 1.10  # heedful's best >= 110 % of the best peer AOPC
CHEAP_SHARE, CHEAP_COST = 0.95, 0.1  # >= 95 % of the best AOPC at <= 1/10 of its cost


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", "--limit", type=int, default=None, dest="n",
                        help="sentences per model (default: full size, 500 on minilm-sentiment, 200 on smollm2-sentiment)")
    parser.add_argument("--methods", default=None, help="comma-separated methods (default: every classification method)")
    parser.add_argument("--skip", default="", help="comma-separated methods to leave out")
    parser.add_argument("--max-cost", type=float, default=3000.0, help="leave out methods above this many forward-pass equivalents per example")
    parser.add_argument("--samples", type=int, default=4, help="F-Fidelity draws per example and ratio")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "frontier.md")
    parser.add_argument("--front", type=Path, default=FRONTIER, help="where the front is written for heedful methods and the page")
    return parser.parse_args()


# ---------------------------------------------------------------------------- measuring
def chosen_methods(model: heedful.Model, args: argparse.Namespace, lengths: np.ndarray) -> tuple[list[str], dict[str, float], list[str]]:
    """The methods to run, their cost per example, and the ones left out (with why)."""
    runs = model.methods()
    names = args.methods.split(",") if args.methods else [n for n, i in registered().items() if "classification" in i.tasks]
    skip = {s for s in args.skip.split(",") if s}
    chosen, costs, left = [], {}, []
    for name in names:
        info = registered()[name]
        if info.needs_sources or name in skip:
            left.append(f"`{name}`: {'ranks sources of a prompt (context attribution)' if info.needs_sources else 'skipped (--skip)'}")
            continue
        if runs.get(name):
            left.append(f"`{name}`: the model does not give it {', '.join(runs[name])}")
            continue
        bound = info.bind({})
        cost = float(np.mean([(lambda f, b: f + 2 * b)(*passes(info, bound, int(n))) for n in lengths]))
        if cost > args.max_cost:
            left.append(f"`{name}`: {cost:,.0f} forward-pass equivalents per example, above --max-cost {args.max_cost:g}")
            continue
        chosen.append(name)
        costs[name] = cost
    return chosen, costs, left


def explain_all(model: heedful.Model, texts: list[str], names: list[str], left: list[str]) -> tuple[dict[str, list], dict[str, float]]:
    """Every method's explanations and its wall seconds per sentence; a method the model refuses
    at run time is added to ``left`` with the refusal."""
    explained, seconds = {}, {}
    for i, name in enumerate(names):
        print(f"[{i + 1}/{len(names)}] explaining with {name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            explained[name] = model.explain(texts, name, batch_size=16)
        except HeedfulError as exc:
            left.append(f"`{name}`: {str(exc).splitlines()[0]}")
            continue
        seconds[name] = (time.perf_counter() - start) / len(texts)
    return explained, seconds


def scores(model: heedful.Model, explained: dict[str, list], inputs, args: argparse.Namespace) -> dict[str, dict[str, np.ndarray]]:
    """Per evaluation, per method: the values ``[n]`` per sentence. All methods' explanations
    of a sentence are measured together, so that perturbed inputs they share run once."""
    names, n = list(explained), len(inputs)
    flat = [explained[m][i] for i in range(n) for m in names]  # sentence-major
    flat_inputs = [inputs[i] for i in range(n) for _ in names]
    found: dict[str, dict[str, np.ndarray]] = {}

    def split(values: np.ndarray) -> dict[str, np.ndarray]:
        return {m: values.reshape(n, len(names))[:, j] for j, m in enumerate(names)}

    batch = len(names) * 4
    operators = [op if op != "mask" else replacement_operator(model.tokenizer) for op in CROSS_OPERATORS]
    for op in operators:
        print(f"curves under the {op} operator", file=sys.stderr, flush=True)
        result = evaluate(model, flat, ["aopc", "sufficiency"], get_protocol(PROTOCOL, removal=op), flat_inputs, batch_size=batch)
        found[f"aopc_{op}"] = split(result["aopc"].per_example.values)
        found[f"sufficiency_{op}"] = split(result["sufficiency"].per_example.values)
    print("soft comprehensiveness and sufficiency", file=sys.stderr, flush=True)
    result = evaluate(model, flat, ["soft_comprehensiveness", "soft_sufficiency"], PROTOCOL, flat_inputs, batch_size=batch)
    for metric in ("soft_comprehensiveness", "soft_sufficiency"):
        found[metric] = split(result[metric].per_example.values)
    if model.name == "minilm-sentiment" and is_built(FFID_MODEL):
        print(f"F-Fidelity on {FFID_MODEL}", file=sys.stderr, flush=True)
        ffid = f_fidelity(heedful.load(FFID_MODEL), flat, get_protocol(PROTOCOL, removal="mask"), samples=args.samples, batch_size=batch)
        found["ffid_plus"], found["ffid_minus"] = split(ffid.plus.values), split(ffid.minus.values)
    return found


# ---------------------------------------------------------------------------- analysing
COLUMNS = {  # key: (heading, higher is better)
    "aopc_mask": ("AOPC [MASK]", True), "aopc_unk": ("AOPC [UNK]", True), "aopc_delete": ("AOPC delete", True),
    "aopc_sample": ("AOPC sampled", True), "sufficiency_mask": ("suff. [MASK]", False), "sufficiency_unk": ("suff. [UNK]", False),
    "sufficiency_delete": ("suff. delete", False), "sufficiency_sample": ("suff. sampled", False),
    "soft_comprehensiveness": ("soft comp.", True), "soft_sufficiency": ("soft suff.", True),
    "ffid_plus": ("FFid+", True), "ffid_minus": ("FFid-", False),
}


def primary(found: dict) -> str:
    return "aopc_mask" if "aopc_mask" in found else "aopc_unk"


def pareto(costs: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``[M]`` bool: no other method is at most as costly and at least as faithful, better in one."""
    dominated = (costs[None, :] <= costs[:, None]) & (values[None, :] >= values[:, None])
    dominated &= (costs[None, :] < costs[:, None]) | (values[None, :] > values[:, None])
    return ~dominated.any(axis=1)


def interval(values: np.ndarray) -> tuple[float, float, float]:
    return bootstrap_mean(values[np.isfinite(values)])


def targets(found: dict, costs: dict[str, float]) -> list[str]:
    """The issue's targets, each as holds / does not hold with the closest method."""
    key = primary(found)
    means = {m: interval(v) for m, v in found[key].items()}
    ours = [m for m in means if m not in PEERS]
    peers = [m for m in means if m in PEERS and m != "random"]
    lines = []
    if ours and peers:
        best_peer = max(peers, key=lambda m: means[m][0])
        best_ours = max(ours, key=lambda m: means[m][0])
        ratio = means[best_ours][0] / means[best_peer][0]
        apart = means[best_ours][1] > means[best_peer][2]
        others = [k for k in found if k != key and not k.startswith("sufficiency") and k != "ffid_minus"]
        worse = []
        for other in others:
            diff, low, high = bootstrap_paired_difference(found[other][best_ours], found[other][best_peer])
            if high < 0:
                worse.append(f"{COLUMNS[other][0]} {diff:+.3f} [{low:+.3f}, {high:+.3f}]")
        holds = ratio >= AOPC_GAIN and apart and not worse
        lines.append(
            f"- heedful's best method beats the best peer method by >= {AOPC_GAIN - 1:.0%} AOPC with intervals apart, "
            f"and is not worse (paired) on the other evaluations: **{'holds' if holds else 'does not hold'}**. "
            f"Closest: `{best_ours}` {means[best_ours][0]:.3f} [{means[best_ours][1]:.3f}, {means[best_ours][2]:.3f}] against "
            f"`{best_peer}` ({PEERS[best_peer]}) {means[best_peer][0]:.3f} [{means[best_peer][1]:.3f}, {means[best_peer][2]:.3f}]: "
            f"{ratio:.1%} of it, intervals {'apart' if apart else 'overlapping'}"
            + (f"; worse (paired) on {', '.join(worse)}" if worse else "; not worse (paired) on any other evaluation") + "."
        )
    best = max(means, key=lambda m: means[m][0])
    cheap = [m for m in means if costs[m] <= CHEAP_COST * costs[best]]
    if cheap:
        closest = max(cheap, key=lambda m: means[m][0])
        share = means[closest][0] / means[best][0]
        holds = share >= CHEAP_SHARE
        lines.append(
            f"- one method reaches >= {CHEAP_SHARE:.0%} of the best AOPC at <= 1/10 of its cost: **{'holds' if holds else 'does not hold'}**. "
            f"Best: `{best}` {means[best][0]:.3f} at {costs[best]:,.0f} forward passes; closest at <= {CHEAP_COST * costs[best]:,.0f}: "
            f"`{closest}` {means[closest][0]:.3f} ({share:.1%}) at {costs[closest]:,.0f}."
        )
    else:
        lines.append(f"- one method reaches >= {CHEAP_SHARE:.0%} of the best AOPC at <= 1/10 of its cost: **does not hold** "
                     f"(the best, `{best}`, costs {costs[best]:,.0f} forward passes; no method costs a tenth of that).")
    return lines


def table(found: dict, costs: dict[str, float], seconds: dict[str, float], front: dict[str, bool]) -> list[str]:
    keys = [k for k in COLUMNS if k in found]
    heads = ["method", "offered by", "cost (fwd-eq)", "s / sentence", *(COLUMNS[k][0] for k in keys), "front"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    order = sorted(costs, key=lambda m: -interval(found[primary(found)][m])[0])
    for m in order:
        cells = [f"`{m}`", PEERS.get(m, "heedful") or "(baseline)", f"{costs[m]:,.0f}", f"{seconds[m]:.3f}"]
        for k in keys:
            mean, low, high = interval(found[k][m])
            cells.append(f"{mean:.3f} [{low:.3f}, {high:.3f}]")
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
        color = "tab:red" if front[m] else ("tab:blue" if m not in PEERS else "tab:gray")
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
def run_model(name: str, n: int, args: argparse.Namespace) -> tuple[list[str], dict | None]:
    model = heedful.load(name)
    data = datasets.load("movies", "test", n=n)
    inputs = model_inputs(data, model.adapter, "predicted")
    texts = [i.text for i in inputs]
    lengths = model.encode(texts).lengths.numpy()
    names, costs, left = chosen_methods(model, args, lengths)
    explained, seconds = explain_all(model, texts, names, left)
    names = list(explained)
    costs = {m: costs[m] for m in names}
    found = scores(model, explained, inputs, args)
    key = primary(found)
    means = np.array([interval(found[key][m])[0] for m in names])
    on = dict(zip(names, pareto(np.array([costs[m] for m in names]), means), strict=True))
    png = args.out.with_name(f"{args.out.stem}-{name}.png")
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(png, found, costs, on, f"{name}: {len(texts)} movies test sentences, protocol {PROTOCOL}")
    ffid = "ffid_plus" in found
    lines = [
        f"## {name}: {len(texts)} movies test sentences (full size {MODELS[name]})",
        "",
        f"![AOPC against cost, {name}]({png.name})",
        "",
        *table(found, costs, seconds, on),
        "",
        "Pareto front (cheapest first): " + ", ".join(f"`{m}`" for m in sorted(names, key=lambda m: costs[m]) if on[m]) + ".",
        "",
        "Targets (issue 43, item 4):",
        "",
        *targets(found, costs),
        "",
    ]
    if not ffid:
        lines += [f"F-Fidelity: not measured (`{FFID_MODEL}` is not built: `heedful models build {FFID_MODEL}`).", ""]
    if left:
        lines += ["Left out: " + "; ".join(left) + ".", ""]
    record = {
        "model": name, "examples": len(texts), "data": "movies test sentences", "protocol": PROTOCOL,
        "methods": {m: {"cost": round(costs[m], 1), **dict(zip(("aopc", "low", "high"), (round(v, 4) for v in interval(found[key][m])), strict=True)),
                        "front": bool(on[m])} for m in names},
    }
    return lines, record


def roar_note(path: Path) -> str:
    """Where ROAR stands: it retrains a classifier per method, fraction and seed, so
    ``benchmarks/roar.py`` measures it apart (and resumes it from its store) in ``path``."""
    where = f"in [{path.name}]({path.name}), which states its cost" if path.exists() else f"in {path.name} (not generated yet)"
    return ("ROAR (Hooker et al. 2019: each method's top-k % tokens removed from the train and test snippets and "
            f"{next(iter(MODELS))} retrained on them) costs a retrain per method, fraction and seed, minutes each: "
            f"`benchmarks/roar.py` measures it apart, {where}.")


def main() -> int:
    args = arguments()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    sections, tasks = [], {}
    for name, full in MODELS.items():
        if not is_built(name):
            message = f"`{name}` is not built here: skipped (build it with `heedful models build {name}`, then run this script again)."
            print(message, file=sys.stderr)
            sections += [f"## {name}", "", message, ""]
            continue
        lines, record = run_model(name, args.n or full, args)
        sections += lines
        tasks.setdefault("classification", record)  # the first model measured is the task's frontier
    minutes = (time.perf_counter() - start) / 60
    sizes = ", ".join(f"{r['examples']} sentences on {r['model']}" for r in [tasks.get("classification")] if r)
    head = [
        "# The faithfulness-cost frontier",
        "",
        f"Generated by `benchmarks/frontier.py` at **{sizes}** ({'full size' if args.n is None else f'--n {args.n}; full size is 500 on minilm-sentiment and 200 on smollm2-sentiment'}). "
        f"Every method at its defaults, explaining the predicted class; scored under protocol `{PROTOCOL}` with each removal operator "
        f"(`delete`, `[MASK]` (`[UNK]` without a mask token), `sample`: a movie-snippet word of the same spaCy part of speech), "
        f"soft comprehensiveness / sufficiency, and F-Fidelity (FFid+ / FFid-, beta = {FFID_BETA}, {args.samples} draws, "
        f"on `{FFID_MODEL}`). Intervals: 95 % percentile bootstrap over sentences; target comparisons: paired bootstrap of the "
        "per-sentence difference. Higher is better except sufficiency and FFid-. Cost: forward-pass equivalents per example "
        "from each method's cost model (a backward counts two); s / sentence: measured wall time on this machine under load.",
        "",
        roar_note(args.out.with_name("roar.md")),
        "",
    ]
    tail = [
        "",
        command_line(),
        f"- run time {minutes:.1f} min; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; torch threads {args.threads}",
        f"- {library_versions('torch', 'transformers', 'spacy')}",
    ]
    write_results(args.out, "\n".join(head + sections + tail) + "\n")
    if tasks:
        args.front.write_text(json.dumps({"source": "docs/results/frontier.md (benchmarks/frontier.py)", "tasks": tasks}, indent=1) + "\n", encoding="utf-8")
    print("\n".join(line for line in sections if line.startswith("- ") or line.startswith("Pareto")))
    print(f"written to {args.out} and {args.front} in {minutes:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
