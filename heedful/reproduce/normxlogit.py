"""``heedful reproduce normxlogit``: the NormXLogit paper's two experiments on the zoo models.

Abbasi et al., *NormXLogit: The Head-on-Top Never Lies* (specs/methods.md §2.1).

* **Experiment 1 (faithfulness).** AOPC and accuracy of the perturbed predictions over the
  perturbation ratios of the ``normxlogit`` protocol preset (``[MASK]`` for encoders, deletion for
  decoders; predicted label; means over 10 .. 90 %) for the random baseline (mean ± std over
  seeds), gradient norm, gradient × input, integrated gradients, the input-embedding norm, LogAt
  and NormXLogit, with signed gradient × input / integrated gradients and (regression) Eq. 8's printed
  sign as extra rows -- on ``minilm-sentiment`` and ``smollm2-sentiment`` (when built) with the movie
  snippets, and the Pearson correlation (and its drop) of ``minilm-sentiment-regression``. Run
  through :func:`heedful.evaluate.bench.run_bench`, so explanations and perturbation curves are
  stored and a rerun computes only what is missing. The paper's BERT / Llama-2 numbers (SST-2,
  STS-B; Tables 1 and 3) sit beside ours, with how far the method orderings agree.
* **Experiment 2 analogue (evidence alignment per layer).** On agreement minimal pairs generated
  by :mod:`heedful.datasets.agreement` (not BLiMP) with ``smollm2-135m`` predicting the target
  word as the next token: dot product and average precision of LogAt(target), LogAt(foil),
  NormXLogit (layer-wise, logit lens) and of the embedding norm and the random baseline against
  the known evidence words, as a layer x method heatmap (the paper's Figures 4-5), beside the logit
  lens's quality per layer (target vs foil, KL to the final distribution, target rank). One
  forward pass per batch of pairs serves every method and every layer.
* **Claims.** Every claim of the paper with this run's number and a verdict.

Report options (``--option key=value``): ``ig_steps`` (encoders, default 20), ``ig_steps_decoder``
(default 8), ``n_decoder`` (examples for the decoder classifier, default ``min(n, 200)``; 0 leaves
the decoder out -- a SmolLM2 forward pass costs about ten times MiniLM's), ``n_regression``
(default 200), ``n_agreement`` (pairs, default 500), ``random_seeds`` (seeds of the random
baseline in Experiment 1, default 2), ``batch_size`` (default 16).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from heedful.evaluate.report import fmt
from heedful.reproduce import ReportSettings
from heedful.reproduce.toolkit import (
    CANNOT_BE_TESTED,
    DOES_NOT_HOLD,
    HOLDS,
    LEGEND,
    NOT_SEPARATED,
    Verdict,
    all_of,
    bench_difference,
    difference_verdict,
    interval_text,
    interval_verdict,
    summary_text,
)

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
def _option(settings: ReportSettings, key: str, default: Any) -> Any:
    return settings.options.get(key, default)


def store_dir(settings: ReportSettings) -> Path:
    """The results store of this report: ``settings.store`` or ``heedful_home()/reproduce/normxlogit``."""
    from heedful.cache import heedful_home

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


# ---------------------------------------------------------------------------- ordering
def ordering(values: dict[str, float], higher_is_better: bool) -> list[str]:
    """Methods from best to worst."""
    finite = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
    return sorted(finite, key=lambda k: -finite[k] if higher_is_better else finite[k])


def pair_agreement(ours: dict[str, float], paper: dict[str, float | None]) -> tuple[float, int, float]:
    """Share of method pairs ordered the same way by both, the number of pairs, Kendall's tau
    (methods without a paper value left out)."""
    common = [
        m for m in ours
        if paper.get(m) is not None and ours[m] is not None and math.isfinite(ours[m]) and math.isfinite(paper[m])
    ]
    same = total = 0
    for i, a in enumerate(common):
        for b in common[i + 1 :]:
            d_ours, d_paper = ours[a] - ours[b], paper[a] - paper[b]
            if d_ours == 0 or d_paper == 0:
                continue
            total += 1
            same += (d_ours > 0) == (d_paper > 0)
    tau = float("nan")
    if len(common) >= 3:
        from scipy.stats import kendalltau

        tau = float(kendalltau([ours[m] for m in common], [paper[m] for m in common]).statistic)
    return (same / total if total else float("nan")), total, tau


def verdict(share: float) -> str:
    if not math.isfinite(share):
        return "cannot be compared"
    if share == 1.0:
        return "agrees"
    if share >= 0.75:
        return "largely agrees"
    if share >= 0.5:
        return "partly agrees"
    return "disagrees"


def _names(order: list[str]) -> str:
    return " > ".join(NAMES.get(m, m) for m in order)


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


def leader(decompx: float, normxlogit: float, higher_is_better: bool) -> str:
    """Which of DecompX and NormXLogit a metric value puts ahead."""
    better = decompx > normxlogit if higher_is_better else decompx < normxlogit
    return "DecompX" if better else "NormXLogit"


def rows_of(result: Any) -> list[str]:
    """The rows of an Experiment 1 table present in ``result``: the paper's methods, then the variants."""
    return [k for k in (*METHODS, *(v.key for v in VARIANTS)) if k in result.groups]


def ordering_chain(order: list[str], intervals: dict[str, tuple[float, float]]) -> str:
    """``A > B ≈ C``: ``≈`` where the 95 % intervals of adjacent methods overlap
    (:func:`heedful.evaluate.report.overlapping`), ``>`` where they are separated, ``>?`` where
    one of the two has no interval."""
    from heedful.evaluate.report import overlapping

    parts = [NAMES.get(order[0], order[0])] if order else []
    for a, b in zip(order, order[1:], strict=False):
        pair = {a: intervals[a], b: intervals[b]}
        known = all(math.isfinite(v) for iv in pair.values() for v in iv)
        sign = ("≈" if overlapping(pair) else ">") if known else ">?"
        parts.append(f"{sign} {NAMES.get(b, b)}")
    return " ".join(parts)


def adjacent_overlaps(order: list[str], intervals: dict[str, tuple[float, float]]) -> list[str]:
    """``"A / B"`` for each pair adjacent in ``order`` whose 95 % intervals overlap."""
    from heedful.evaluate.report import overlapping

    found = []
    for a, b in zip(order, order[1:], strict=False):
        found += [f"{NAMES.get(a, a)} / {NAMES.get(b, b)}" for _ in overlapping({a: intervals[a], b: intervals[b]})]
    return found


def better(a: Any, b: Any, higher_is_better: bool) -> tuple[bool, bool]:
    """Whether summary ``a`` is ahead of ``b``, and whether their 95 % intervals are separated."""
    from heedful.evaluate.report import overlapping

    ahead = a.value > b.value if higher_is_better else a.value < b.value
    separated = a.has_interval and b.has_interval and not overlapping({"a": (a.low, a.high), "b": (b.low, b.high)})
    return bool(ahead), bool(separated)


def _eq8_lines(result: Any, metric: str, higher: bool) -> list[str]:
    """The regression case: Eq. 8 nearest first (heedful) against the printed sign, and random."""
    groups = result.groups
    if not all(k in groups for k in ("logat", "normxlogit", "logat_far", "normxlogit_far", "random")):
        return []
    s = {k: groups[k].summaries[metric] for k in ("logat", "normxlogit", "logat_far", "normxlogit_far", "random")}
    rnd = s["random"]
    lines = [f"**Eq. 8's ranking direction** ({metric}, {'higher' if higher else 'lower'} is better; random "
             f"{summary_text(rnd)}):", ""]
    for near, far in (("logat", "logat_far"), ("normxlogit", "normxlogit_far")):
        ahead_near, sep_near = better(s[near], rnd, higher)
        ahead_far, sep_far = better(s[far], rnd, higher)
        lines.append(
            f"- {NAMES[near]}: nearest first {summary_text(s[near])} "
            f"({'ahead of' if ahead_near else 'behind'} random{', separated' if sep_near else ', intervals overlap'}); "
            f"farthest first (the printed sign) {summary_text(s[far])} "
            f"({'ahead of' if ahead_far else 'behind'} random{', separated' if sep_far else ', intervals overlap'}); "
            f"nearest first is {'ahead of' if better(s[near], s[far], higher)[0] else 'behind'} the printed sign"
            f"{' (separated)' if better(s[near], s[far], higher)[1] else ' (intervals overlap)'}."
        )
    lines += [
        "",
        "The paper prints Eq. 8 as the distance |HoT(x_i) − HoT(x_CLS)| and calls the tokens with the highest "
        "scores the most important, while its text motivates LogAt by the opposite: \"the [CLS] token has a higher "
        "degree of similarity to the most important input tokens ... To identify the tokens that are most similar "
        "to [CLS], we use the head-on-top\" (v2 §3.3; its abstract: importance is \"how predictive its "
        "representation is of the model's final output\"). The released code has no regression case (it ships "
        "MultiNLI and BLiMP notebooks only). Its STS-B results put LogAt and NormXLogit far ahead of random "
        f"(BERT: {fmt(PAPER_STSB_PEARSON['logat'][BERT])} and {fmt(PAPER_STSB_PEARSON['normxlogit'][BERT])} vs "
        f"{fmt(PAPER_STSB_PEARSON['random'][BERT])}), which is what the nearest-first reading gives here and the "
        "printed sign does not; heedful ranks nearest first by default (`regression_rank=\"near\"`; "
        "`\"far\"` is the printed sign).",
        "",
    ]
    return lines


def _gradient_sign_lines(result: Any, metric: str, higher: bool) -> list[str]:
    """L1-aggregated gradient rows (the paper's) against the signed sums."""
    lines = []
    for l1, signed in (("grad_x_input", "grad_x_input_signed"), ("integrated_gradients", "integrated_gradients_signed")):
        if l1 not in result.groups or signed not in result.groups:
            continue
        a, b = result.groups[l1].summaries[metric], result.groups[signed].summaries[metric]
        ahead, separated = better(b, a, higher)
        lines.append(
            f"- {NAMES[l1]}: L1 {summary_text(a)}, signed sum {summary_text(b)} -- the signed sum is "
            f"{'ahead' if ahead else 'behind'}{' (separated)' if separated else ' (intervals overlap)'}."
        )
    return ([f"**Gradient aggregation** ({metric}):", "", *lines, ""]) if lines else []


def case_section(case: Case, result: Any, wall: float, plots: list[Path], ig_steps: int, aggregate: str | None) -> list[str]:
    """Markdown of one case: ours vs the paper, ordering agreement, per-ratio curves, cost."""
    from heedful.evaluate.metrics import METRICS

    p = result.spec.protocol
    rows = rows_of(result)
    removal = "deletion" if case.decoder else "`[MASK]`"
    skipped = ", ".join(f"{k}: {v}" for k, v in result.skipped.items())
    lines = [
        f"- data: `movies` test split (VADER movie-review snippets), first {result.n_examples} examples"
        + (f" (skipped: {skipped})" if skipped else ""),
        f"- model: `{result.model_name}`; removal: {removal}; output watched: "
        + ("the regression value" if result.task == "regression" else f"probability of the {p.label} class")
        + "; "
        f"means over {int(100 * p.mean_over[0])}..{int(100 * p.mean_over[1])} % of tokens removed",
        f"- integrated gradients: {ig_steps} steps (Gauss-Legendre); {_aggregation_note(aggregate)}; the "
        "\"signed sum\" rows run gradient × input and integrated gradients with `aggregate=\"sum\"` (the gradient "
        "norm has no signed form)",
        f"- random: mean ± std over {p.random_seeds} seeds; wall time of this section in this run: {wall / 60:.1f} min "
        "(stored explanations and measurements reused; the s / example column is the cost of explaining)",
    ]
    if result.task == "regression":
        lines.append("- LogAt and NormXLogit: Eq. 8 nearest first (heedful's default); the \"as printed\" rows rank "
                     "the farthest first (see *Eq. 8's ranking direction* below)")
    if result.n_examples < 100:
        lines.append(f"- **small sample** (n = {result.n_examples}, chosen to fit the time budget): the ordering of "
                     "methods whose values are close is not reliable")
    lines += [""]
    header = ["method"]
    for metric in case.metrics:
        arrow = "↑" if METRICS[metric].higher_is_better else "↓"
        header.append(f"{metric} {arrow} (ours)")
        if metric in case.paper:
            header.append(f"paper ({case.column_name})")
    header.append("s / example")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in rows:
        res = result.groups[method]
        cells = [NAMES[method]]
        for metric in case.metrics:
            cells.append(summary_text(res.summaries[metric], res.seeds))
            if metric in case.paper:
                cells.append(fmt(case.paper[metric].get(method, (None, None))[case.column]))
        cells.append(fmt(res.cost["seconds"], digits=4))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Brackets: 95 % percentile bootstrap interval over examples (1000 resamples; for the Pearson "
              "metrics r is recomputed on every resample; the random baseline: of the per-example means over its "
              "seeds, for the Pearson metrics: of the mean over its seeds of r on each resample); ± is the standard deviation over the random seeds.", ""]
    for metric, label in (("accuracy", "Accuracy"), ("pearson", "Pearson r")):
        clean = result.groups["normxlogit"].summaries[metric].curve if metric in case.metrics else None
        if clean is not None and len(clean) and result.x[0] == 0 and math.isfinite(clean[0]):
            lines += [f"{label} of the unperturbed model on these examples (ratio 0): {clean[0]:.3f}.", ""]
    for metric in case.metrics:
        higher = METRICS[metric].higher_is_better
        summaries = {m: result.groups[m].summaries[metric] for m in rows}
        ours = {m: s.value for m, s in summaries.items()}
        intervals = {m: (s.low, s.high) for m, s in summaries.items()}
        ours_order = ordering(ours, higher)
        close = adjacent_overlaps(ours_order, intervals)
        lines += [
            f"**Ordering by {metric}** ({'higher' if higher else 'lower'} is better; `≈`: the 95 % intervals of the "
            "two adjacent methods overlap, `>`: separated):",
            "",
            f"- ours: {ordering_chain(ours_order, intervals)}",
            "- adjacent methods whose intervals overlap (no difference claimed): " + ("; ".join(close) if close else "none") + ".",
        ]
        if metric in case.paper:
            paper = {m: v[case.column] for m, v in case.paper[metric].items()}
            share, pairs, tau = pair_agreement({m: ours[m] for m in METHODS if m in ours}, paper)
            paper_order = ordering(paper, higher)
            lines += [
                f"- paper ({case.column_name}): {_names(paper_order)}",
                f"- {share * 100:.0f} % of the {pairs} pairs of the paper's methods are ordered alike (Kendall τ = "
                f"{fmt(tau, digits=2)}): the ordering **{verdict(share)}** with the paper's"
                + (f"; best method: ours {NAMES[ours_order[0]]}, paper {NAMES[paper_order[0]]}" if ours_order else "")
                + ".",
            ]
        lines.append("")
        if result.task == "regression" and metric == "pearson":
            lines += _eq8_lines(result, metric, higher)
        if metric == case.metrics[0]:
            lines += _gradient_sign_lines(result, metric, higher)
        nx, rnd = summaries["normxlogit"], summaries["random"]
        if "embedding_norm" in summaries and not better(summaries["embedding_norm"], rnd, higher)[0]:
            lines += [f"- The embedding norm is behind random on {metric} here; it does not depend on the task "
                      "or the predicted class at all.", ""]
        gradient_rows = [m for m in (*GRADIENT_ROWS, "random") if m in summaries]
        beaten = [m for m in gradient_rows if better(summaries[m], nx, higher)[0]]
        unseparated = [m for m in gradient_rows if m not in beaten and not better(nx, summaries[m], higher)[1]]
        lines += [
            "- NormXLogit vs the gradient rows and random: "
            + ("ahead of all of them" if not beaten else f"behind {', '.join(NAMES[m] for m in beaten)}")
            + (f"; not separated from {', '.join(NAMES[m] for m in unseparated)}" if unseparated else "")
            + ".",
            "",
        ]
        if "decompx" in summaries and math.isfinite(summaries["decompx"].value) and metric in case.paper:
            dx = summaries["decompx"]
            said = case.paper[metric]["decompx"][case.column]
            paper_nx = case.paper[metric]["normxlogit"][case.column]
            sep = better(dx, nx, higher)[1]
            lines += [
                f"- DecompX vs NormXLogit: {summary_text(dx)} vs {summary_text(nx)}, {leader(dx.value, nx.value, higher)} "
                f"ahead{' (separated)' if sep else ' (intervals overlap)'}; "
                + (f"the paper ({case.column_name}): {fmt(said)} vs {fmt(paper_nx)}, {leader(said, paper_nx, higher)} ahead."
                   if said is not None else f"the paper has no DecompX number for {case.column_name} (\"N/A\": it "
                   "calls DecompX specific to BERT-like encoders; heedful's decomposes the Llama family as well)."),
                "",
            ]
    curve_metrics = [m for m in case.metrics if METRICS[m].curve_kind == "ratio"]
    for metric in curve_metrics:
        xs = [f"{100 * x:.0f}%" for x in result.x]
        lines += [f"<details><summary>{metric} per perturbation ratio</summary>", "",
                  "| method | " + " | ".join(xs) + " |", "|" + "---|" * (len(xs) + 1)]
        for method in rows:
            curve = result.groups[method].summaries[metric].curve
            if curve is None:
                continue
            lines.append(f"| {NAMES[method]} | " + " | ".join(fmt(v) for v in curve) + " |")
        lines += ["", "</details>", ""]
    for path in plots:
        lines += [f"![{path.stem}]({path.name})", ""]
    return lines


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


LENS_ROWS = ("correct", "kl", "log_rank", "top_first", "first_norm")
"""Per pair and layer: the final norm + unembedding of the layer's state at the anchor prefers the
target over the foil (1/0); KL(final || layer) in nats; log10(1 + rank of the target) among the
vocabulary; LogAt(target)'s top position is the first token (1/0); the first token's hidden-state
norm over the median norm of the other positions."""


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
) -> tuple[dict[str, list[np.ndarray]], list[np.ndarray], dict[str, list[np.ndarray]]]:
    """Per example: scores ``[L, N]`` (``[N]`` for layer-free methods, ``[S, N]`` for the random
    seeds) of every Experiment 2 method, the evidence vector ``[N]``, and the logit lens's
    quality ``[L]`` per :data:`LENS_ROWS` row.

    One forward pass with hidden states per batch; LogAt / NormXLogit read every layer's
    hidden states through the head (logit lens), the registered method functions doing the work.
    """
    import torch

    from heedful.attribution import get_method
    from heedful.datasets.evidence import token_evidence
    from heedful.evaluate.evaluation import lm_token
    from heedful.targets import Columns

    adapter = model.adapter
    method = {name: get_method(name, adapter.task) for name in EXP2_REGISTERED}
    plural = lm_token(adapter, PLURAL)
    scores: dict[str, list[np.ndarray]] = {m: [] for m in EXP2_METHODS}
    evidence: list[np.ndarray] = []
    lens: dict[str, list[np.ndarray]] = {k: [] for k in LENS_ROWS}
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
            for key, values in quality.items():
                lens[key].append(values[b])
            lens["top_first"].append((scores["logat_target"][-1].argmax(axis=-1) == 0).astype(np.float64))
            lens["first_norm"].append((norms[b, :, 0] / norms[b, :, 1:n].median(dim=-1).values).double().numpy()
                                      if n > 1 else np.full(norms.shape[1], np.nan))
    return scores, evidence, lens


ALIGNMENT_VERSION = 3  # bump when the alignment computation changes, so cached results are redone
EXP2_REGISTERED = ("logat", "normxlogit", "globenc", "alti", "value_zeroing", "embedding_norm", "random")
"""The registered methods whose outputs the alignment is computed from."""


def _alignment_cache(settings: ReportSettings, model, data, n: int) -> Path:
    """Where the alignment of ``model`` on ``n`` pairs of ``data`` is kept: named by the model's
    label and keyed by its fingerprint, the pairs' content and the methods' versions."""
    import hashlib

    from heedful.attribution import get_method
    from heedful.fingerprint import DIGITS, dataset_fingerprint, model_fingerprint
    from heedful.options import canonical_json

    identity = {
        "model": model_fingerprint(model).digest,
        "data": dataset_fingerprint(data),
        "methods": {name: get_method(name).version for name in EXP2_REGISTERED},
    }
    digest = hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:DIGITS]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.name)
    return store_dir(settings) / f"alignment-v{ALIGNMENT_VERSION}-{safe}-{digest}-n{n}.json"


def _save_alignment(al: Alignment, path: Path) -> None:
    import json

    data = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in vars(al).items() if k not in ("paradigms", "lens")}
    data["paradigms"] = {p: {k: np.asarray(v).tolist() for k, v in d.items()} for p, d in al.paradigms.items()}
    data["lens"] = None if al.lens is None else {k: np.asarray(v).tolist() for k, v in al.lens.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def _load_alignment(path: Path) -> Alignment | None:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = ("dot", "ap", "dot_std", "ap_std", "dot_low", "dot_high", "ap_low", "ap_high")
    arrays = {k: None if data.get(k) is None else np.array(data[k], dtype=float) for k in keys}
    paradigms = {p: {k: np.array(v, dtype=float) for k, v in d.items()} for p, d in data["paradigms"].items()}
    lens = None if data.get("lens") is None else {k: np.array(v, dtype=float) for k, v in data["lens"].items()}
    return Alignment(n=data["n"], layers=data["layers"], paradigms=paradigms, skipped=data["skipped"],
                     seconds=data["seconds"], model_name=data["model_name"], lens=lens, **arrays)


def run_alignment(settings: ReportSettings, n: int, batch_size: int) -> Alignment:
    """Experiment 2 analogue on ``n`` agreement pairs with the causal LM (kept in the results
    store folder, so a rerun reads it back)."""
    import heedful
    from heedful.evaluate.metrics import average_precision_score, dot_product_score
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
    scores, evidence, lens = alignment_scores(model, items, batch_size)
    layers = scores["logat_target"][0].shape[0]
    rows = len(EXP2_METHODS)
    per_example = {k: np.full((rows, layers, len(items)), np.nan) for k in ("dot", "ap")}
    random_seed_means = {k: np.full((RANDOM_SEEDS_EXP2, layers), np.nan) for k in ("dot", "ap")}
    fns = {
        "dot": lambda s, e: dot_product_score(s, e, protocol.dot_normalization),
        "ap": average_precision_score,
    }
    seed_values = {k: np.full((RANDOM_SEEDS_EXP2, len(items)), np.nan) for k in fns}
    for j, ev in enumerate(evidence):
        if not ev.any() or ev.all():
            continue
        for r, name in enumerate(EXP2_METHODS):
            if not scores[name]:  # LogAt(plural) when the word is not one token of this vocabulary
                continue
            s = scores[name][j]
            for key, fn in fns.items():
                if name == "random":
                    vals = np.array([fn(row, ev) for row in s])
                    seed_values[key][:, j] = vals
                    per_example[key][r, :, j] = vals.mean()
                elif s.ndim == 1:
                    per_example[key][r, :, j] = fn(s, ev)
                else:
                    per_example[key][r, :, j] = [fn(row, ev) for row in s]
    for key in fns:
        random_seed_means[key] = np.nanmean(seed_values[key], axis=1)
    mean = {k: np.nanmean(v, axis=2) for k, v in per_example.items()}
    std = {k: np.nanstd(v, axis=2, ddof=1) for k, v in per_example.items()}
    r = EXP2_METHODS.index("random")
    for key in fns:
        std[key][r, :] = np.nanstd(random_seed_means[key], ddof=1)
    paradigms: dict[str, dict[str, np.ndarray]] = {}
    labels = np.array([p for _, _, p in items])
    for paradigm in dict.fromkeys(labels.tolist()):
        chosen = labels == paradigm
        paradigms[paradigm] = {k: np.nanmean(v[:, :, chosen], axis=2) for k, v in per_example.items()}
        paradigms[paradigm]["n"] = np.array(int(chosen.sum()))
    bounds = {k: per_layer_intervals(v) for k, v in per_example.items()}
    al = Alignment(
        n=len(items), layers=layers, dot=mean["dot"], ap=mean["ap"], dot_std=std["dot"], ap_std=std["ap"],
        paradigms=paradigms, skipped=skipped, seconds=time.perf_counter() - began, model_name=LM,
        dot_low=bounds["dot"][0], dot_high=bounds["dot"][1], ap_low=bounds["ap"][0], ap_high=bounds["ap"][1],
        lens=lens_summary(lens, evidence),
    )
    _save_alignment(al, cache)
    return al


def per_layer_intervals(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95 % bootstrap intervals of the mean over examples (NaNs left out) of ``values``
    ``[..., E]`` -> ``low``, ``high`` ``[...]``."""
    from heedful.evaluate.intervals import bootstrap_mean

    flat = values.reshape(-1, values.shape[-1])
    low, high = np.full(flat.shape[0], np.nan), np.full(flat.shape[0], np.nan)
    for i, row in enumerate(flat):
        finite = row[np.isfinite(row)]
        if finite.size > 1:
            _, low[i], high[i] = bootstrap_mean(finite)
    return low.reshape(values.shape[:-1]), high.reshape(values.shape[:-1])


def lens_summary(lens: dict[str, list[np.ndarray]], evidence: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per layer means of :data:`LENS_ROWS` over the pairs with their 95 % intervals (``key``,
    ``key_low``, ``key_high``; the median for ``first_norm``), and ``evidence_first``."""
    found: dict[str, np.ndarray] = {}
    for key in LENS_ROWS:
        stack = np.stack(lens[key], axis=1)  # [L, E]
        found[key] = np.nanmedian(stack, axis=1) if key == "first_norm" else np.nanmean(stack, axis=1)
        if key != "first_norm":
            found[f"{key}_low"], found[f"{key}_high"] = per_layer_intervals(stack)
    found["evidence_first"] = np.array(float(np.mean([bool(e[0]) for e in evidence])) if evidence else np.nan)
    return found


def plot_alignment(al: Alignment, path: Path) -> Path:
    """Layer x method heatmaps of dot product and average precision (the paper's Figures 4-5)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    labels = [EXP2_NAMES[m] for m in EXP2_METHODS]
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 0.55 * al.layers + 3), 7.5), facecolor="white")
    for ax, values, title in zip(axes, (al.dot, al.ap), ("Dot product ↑", "Average precision ↑"), strict=True):
        im = ax.imshow(values, aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels)
        ax.set_xticks(range(al.layers))
        ax.set_xticklabels([str(i + 1) for i in range(al.layers)], fontsize=8)
        ax.set_xlabel("layer")
        ax.set_title(f"{title} · {LM} · generated agreement pairs (n={al.n})", fontsize=11)
        hi = np.nanmax(values)
        lo = np.nanmin(values)
        for r in range(values.shape[0]):
            for c in range(values.shape[1]):
                v = values[r, c]
                if math.isfinite(v):
                    ax.text(c, r, f"{v:.2f}"[1:] if 0 <= v < 1 else f"{v:.1f}", ha="center", va="center", fontsize=6,
                            color="black" if v > lo + 0.6 * (hi - lo) else "white")
        fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _trend(row: np.ndarray, third: int) -> str:
    return f"{np.nanmean(row[:third]):.3f} → {np.nanmean(row[-third:]):.3f}"


def alignment_cell(al: Alignment, key: str, row: int, layer: int) -> str:
    """``value [low, high]`` of method ``row`` at ``layer`` for metric ``key`` (``"dot"`` / ``"ap"``);
    the random row also ``± std over seeds``."""
    values, std = getattr(al, key), getattr(al, f"{key}_std")
    low, high = getattr(al, f"{key}_low"), getattr(al, f"{key}_high")
    bounds = (low[row, layer], high[row, layer]) if low is not None and high is not None else (math.nan, math.nan)
    return interval_text(values[row, layer], *bounds, std=std[row, layer] if EXP2_METHODS[row] == "random" else None)


def alignment_section(al: Alignment, plot: Path) -> list[str]:
    from heedful.datasets.agreement import BLIMP_UIDS

    lines = [
        f"- model: `{al.model_name}` (causal LM; the input is the sentence up to the target word, the "
        "explained output is the next-token logit of the target (LogAt(target), NormXLogit) or of the foil "
        "(LogAt(foil)); the head is applied to every layer's hidden states after the final norm, the "
        "logit lens)",
        f"- data: {al.n} generated agreement minimal pairs (heedful's generator following BLiMP's paradigms, "
        "**not BLiMP**; evidence known by construction), the paradigms whose evidence precedes the target"
        + (f"; skipped: {', '.join(f'{k}: {v}' for k, v in al.skipped.items())}" if al.skipped else ""),
        "- metrics: dot product of the softmax-normalised scores with the evidence vector, average precision "
        "of the ranking (NormXLogit protocol; every position of the prefix counts)",
        "- GlobEnc¬, ALTI¬ and Value Zeroing¬: each layer's own token-to-token matrix, the anchor's row, without "
        "rollout (as the paper's Experiment 2; `rollout=False, layerwise=True`); in this pre-LN decoder GlobEnc's "
        "norm is that of each source's vector after attention (no norm follows the block). LogAt(plural): the "
        f"logit lens of the word \"{PLURAL}\" (the paper's appendix A.3 analysis)",
        f"- embedding norm and random are the same at every layer; random: uniform scores, mean over "
        f"{RANDOM_SEEDS_EXP2} seeds (the paper's random baseline gives all tokens equal scores)",
        "- the paper runs this on a masked LM (RoBERTa) over five BLiMP paradigms, where the evidence may follow "
        "the masked word and the paper reports NormXLogit best at almost all layers, LogAt(foil) below "
        "LogAt(target), the foil falling and the target rising with depth; here a causal LM sees only the prefix, "
        "so the comparison is in kind, not in number",
        f"- one forward pass per batch of pairs serves every method and layer; computed in {al.seconds:.0f} s",
        "",
        f"![layer x method alignment]({plot.name})",
        "",
    ]
    for key, values, title in (("dot", al.dot, "Dot product"), ("ap", al.ap, "Average precision")):
        best_r, best_l = np.unravel_index(np.nanargmax(values), values.shape)
        lines += [f"**{title}** (↑): best cell {EXP2_NAMES[EXP2_METHODS[best_r]]} at layer {best_l + 1} "
                  f"({alignment_cell(al, key, int(best_r), int(best_l))}); brackets: 95 % bootstrap intervals over pairs (random: of the "
                  "per-pair means over its seeds; ± its std over seeds).", ""]
        lines += ["| method | best layer | value there | last layer | mean over layers |", "|---|---|---|---|---|"]
        for r, m in enumerate(EXP2_METHODS):
            row = values[r]
            b = int(np.nanargmax(row))
            lines.append(
                f"| {EXP2_NAMES[m]} | {b + 1 if m not in ('embedding_norm', 'random') else '–'} | "
                f"{alignment_cell(al, key, r, b)} | {alignment_cell(al, key, r, len(row) - 1)} | {fmt(float(np.nanmean(row)))} |"
            )
        lines.append("")
        wins = {m: 0 for m in EXP2_METHODS}
        for layer in range(values.shape[1]):
            wins[EXP2_METHODS[int(np.nanargmax(values[:, layer]))]] += 1
        lines += ["Best method per layer (count of layers): "
                  + ", ".join(f"{EXP2_NAMES[m]} {c}" for m, c in wins.items() if c) + ".", ""]
        tgt, foil = values[EXP2_METHODS.index("logat_target")], values[EXP2_METHODS.index("logat_foil")]
        third = max(1, values.shape[1] // 3)
        lines += [f"LogAt(target) above LogAt(foil) at {int((tgt > foil).sum())} of {values.shape[1]} layers. "
                  f"Mean over the first → last third of layers: LogAt(target) {_trend(tgt, third)}, "
                  f"LogAt(foil) {_trend(foil, third)}, NormXLogit {_trend(values[EXP2_METHODS.index('normxlogit')], third)}.",
                  ""]
        ours = values[EXP2_METHODS.index("normxlogit")]
        theirs = values[[EXP2_METHODS.index(m) for m in ("globenc", "alti", "value_zeroing")]]
        if np.isfinite(theirs).any():
            lines += [f"NormXLogit above all of GlobEnc¬, ALTI¬ and Value Zeroing¬ at {int((ours > np.nanmax(theirs, axis=0)).sum())} "
                      f"of {values.shape[1]} layers (the paper: \"across almost all layers\").", ""]
    for values, title in ((al.dot, "Dot product"), (al.ap, "Average precision")):
        lines += [f"<details><summary>{title} per layer</summary>", "",
                  "| method | " + " | ".join(str(i + 1) for i in range(al.layers)) + " |", "|" + "---|" * (al.layers + 1)]
        lines += [f"| {EXP2_NAMES[m]} | " + " | ".join(fmt(v, digits=2) for v in values[r]) + " |" for r, m in enumerate(EXP2_METHODS)]
        lines += ["", "</details>", ""]
    nx = EXP2_METHODS.index("normxlogit")
    best_layer = int(np.nanargmax(al.ap[nx]))
    lines += [f"<details><summary>Per paradigm at NormXLogit's best AP layer ({best_layer + 1})</summary>", "",
              "| paradigm (BLiMP counterpart) | n | " + " | ".join(f"{EXP2_NAMES[m]} AP" for m in EXP2_METHODS) + " |",
              "|" + "---|" * (len(EXP2_METHODS) + 2)]
    for paradigm, vals in al.paradigms.items():
        lines.append(f"| {paradigm} ({BLIMP_UIDS[paradigm]}) | {int(vals['n'])} | "
                     + " | ".join(fmt(vals["ap"][r, best_layer]) for r in range(len(EXP2_METHODS))) + " |")
    lines += ["", "</details>", ""]
    return lines


def plot_lens(al: Alignment, path: Path) -> Path:
    """Per layer: the logit lens's share of pairs preferring the target over the foil, the share
    whose LogAt(target) top is the first token, LogAt(target)'s and random's dot product, and
    KL(final || layer) on a second axis."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    lens = al.lens or {}
    x = np.arange(1, al.layers + 1)
    fig, ax = plt.subplots(figsize=(10, 4.5), facecolor="white")
    ax.plot(x, lens["correct"], marker="o", label="logit lens prefers the target over the foil (share)")
    ax.fill_between(x, lens["correct_low"], lens["correct_high"], alpha=0.2, linewidth=0)
    ax.plot(x, lens["top_first"], marker="s", label="LogAt(target) top at the first token (share)")
    t, r = EXP2_METHODS.index("logat_target"), EXP2_METHODS.index("random")
    ax.plot(x, al.dot[t], marker="^", label="LogAt(target) dot product")
    ax.plot(x, al.dot[r], linestyle="--", color="grey", label="random dot product")
    ax.axhline(0.5, color="black", linewidth=0.5)
    ax.set_xlabel("layer")
    ax.set_ylim(0, 1)
    right = ax.twinx()
    right.plot(x, lens["kl"], color="C3", linestyle=":", marker=".", label="KL(final ‖ layer), nats")
    right.set_ylabel("KL (nats)")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    ax.set_title(f"Logit lens of {LM} at the anchor, {al.n} agreement pairs", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _layer_span(layers: list[int]) -> str:
    """``"12-19, 21"`` from 0-based layer indices (shown 1-based)."""
    spans: list[list[int]] = []
    for layer in layers:
        if spans and layer == spans[-1][1] + 1:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer])
    return ", ".join(f"{a + 1}" if a == b else f"{a + 1}-{b + 1}" for a, b in spans)


def below_random(al: Alignment, method: str = "logat_target") -> list[int]:
    """Layers (0-based) where ``method``'s dot-product interval lies wholly below random's."""
    m, r = EXP2_METHODS.index(method), EXP2_METHODS.index("random")
    if al.dot_low is None or al.dot_high is None:
        return [k for k in range(al.layers) if al.dot[m, k] < al.dot[r, k]]
    return [k for k in range(al.layers) if al.dot_high[m, k] < al.dot_low[r, k]]


def lens_section(al: Alignment, plot: Path) -> list[str]:
    """Markdown: the logit lens's quality per layer and what it says about the layers where
    LogAt(target) aligns below random."""
    lens = al.lens
    if lens is None:
        return []
    t, r = EXP2_METHODS.index("logat_target"), EXP2_METHODS.index("random")
    below = below_random(al)
    late = list(range(max(0, al.layers - 3), al.layers))
    lines = [
        "### Why some layers align below random: the logit lens of each layer",
        "",
        "For every pair and layer, the final norm and unembedding applied to that layer's state at the anchor "
        "(the last prefix token; what LogAt reads at every position): whether it gives the target a higher logit "
        "than the foil, the KL divergence of the final layer's next-token distribution from it, and the target's "
        "rank in the vocabulary (geometric mean of 1 + rank, minus 1); beside them, the share of pairs whose "
        "LogAt(target) puts its top score on the first token, and the median ratio of the first token's hidden-state "
        "norm to the median norm of the other positions. Brackets: 95 % bootstrap intervals over pairs.",
        "",
        f"![logit lens per layer]({plot.name})",
        "",
        "| layer | lens prefers target | KL(final ‖ layer) | target rank | LogAt(target) top at first token | "
        "first-token norm ÷ others | LogAt(target) dot | random dot |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(key: str, k: int, pct: bool = False) -> str:
        v, lo, hi = lens[key][k], lens[f"{key}_low"][k], lens[f"{key}_high"][k]
        f = (lambda z: f"{100 * z:.0f} %") if pct else (lambda z: f"{z:.2f}")
        return f"{f(v)} [{f(lo)}, {f(hi)}]"

    def dot_cell(row: int, k: int) -> str:
        if al.dot_low is None or al.dot_high is None:
            return fmt(al.dot[row, k])
        return f"{fmt(al.dot[row, k])} [{fmt(al.dot_low[row, k])}, {fmt(al.dot_high[row, k])}]"

    for k in range(al.layers):
        rank = 10 ** lens["log_rank"][k] - 1
        lines.append(
            f"| {k + 1} | {cell('correct', k, True)} | {cell('kl', k)} | {rank:.0f} | {cell('top_first', k, True)} | "
            f"{lens['first_norm'][k]:.0f}× | {dot_cell(t, k)} | {dot_cell(r, k)} |"
        )
    lines.append("")
    if not below:
        return lines + ["LogAt(target)'s dot product is not below random's at any layer here (intervals).", ""]

    def mean(key: str, layers: list[int]) -> float:
        return float(np.mean(lens[key][layers]))

    correct, kl, top = mean("correct", below), mean("kl", below), mean("top_first", below)
    rank = 10 ** mean("log_rank", below) - 1
    norm = float(np.median(lens["first_norm"][below]))
    first = float(lens["evidence_first"])
    chance = all(lens["correct_low"][k] <= 0.5 <= lens["correct_high"][k] for k in below)
    lines += [
        f"**What the numbers say.** LogAt(target)'s dot product lies below random's (intervals separated) at layers "
        f"{_layer_span(below)}. There the logit lens prefers the target over the foil in {100 * correct:.0f} % of pairs "
        + ("(every one of these layers' intervals contains 50 %: chance)" if chance else "(chance: 50 %)")
        + f", its distribution is {kl:.1f} nats from the final one and the target's typical rank is {rank:.0f}; in "
        f"the last three layers ({_layer_span(late)}) the same numbers are {100 * mean('correct', late):.0f} %, "
        f"{mean('kl', late):.1f} nats and {10 ** mean('log_rank', late) - 1:.0f}. "
        + ("Read through the final norm and unembedding, these layers' states do not yet carry the agreement "
           "decision, so LogAt at them measures something other than evidence for the target. " if chance else
           "Read through the final norm and unembedding, these layers' states carry little of the agreement decision "
           f"(within {100 * (correct - 0.5):.0f} points of chance, against {100 * (mean('correct', late) - 0.5):.0f} "
           "at the end), so LogAt at them mostly measures something other than evidence for the target. "
           if correct < 0.65 and kl > 5 else "")
        + f"In those layers LogAt(target)'s top score sits on the first token in {100 * top:.0f} % of pairs, while "
        f"the first token is evidence in {100 * first:.0f} % of pairs; the first token's state there has {norm:.0f}× "
        "the median norm of the other positions"
        + (" (a massive activation of the first position, which the final norm rescales into an extreme logit "
           "vector)" if norm >= 10 else "")
        + ". "
        + ("The dot product normalises scores with a softmax over the prefix, so scores that concentrate on a "
           "non-evidence first token give the evidence less mass than uniform random scores do -- below random "
           "rather than at it." if top > first + 0.1 else
           "The first token is not where LogAt concentrates more often than it is evidence, so it does not explain "
           "the gap by itself."),
        "",
    ]
    return lines


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
    run (:func:`heedful.memory.reset_peak_rss`)."""
    import statistics

    import heedful
    from heedful.memory import current_rss, peak_rss, reset_peak_rss

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


def timing_section(timing: Timing) -> list[str]:
    """Markdown of the cost comparison: ours beside the paper's Table 4, and peak memory."""
    import torch

    lengths = sorted(timing.repeats)
    names = [COST_NAMES[m] for m in TIMING_METHODS]
    lines = [
        f"- model: `{timing.model_name}` (MiniLM-L6, 6 layers, hidden size 384; the paper: BERT-base, 12 layers, 768, on "
        "an RTX 8000 GPU); one input of each length (movie snippets joined and cut), explained alone (batch of one) "
        f"with heedful's defaults; integrated gradients with {timing.ig_steps} steps (the paper: 50); "
        f"CPU, {torch.get_num_threads()} torch thread(s)",
        "- seconds: median over " + ", ".join(f"{timing.repeats[n]} run(s) at {n}" for n in lengths)
        + " after one warm-up run of every method; peak memory: the increase of the process's peak resident memory "
        "during the run over its resident memory before it (the model's weights excluded)",
        "",
        "**Seconds per example** (ours; the paper's Table 4 in brackets where it has the method):",
        "",
        "| input length | " + " | ".join(names) + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for n in lengths:
        cells = []
        for m in TIMING_METHODS:
            said = PAPER_TIMING.get(n, {}).get(m)
            cells.append(f"{timing.seconds[(m, n)]:.3f}" + (f" ({said:.2f})" if said is not None else ""))
        lines.append(f"| {timing.tokens.get(n, n)} | " + " | ".join(cells) + " |")
    lines += ["", "**Peak memory per example (MB)**:", "", "| input length | " + " | ".join(names) + " |",
              "|" + "---|" * (len(names) + 1)]
    for n in lengths:
        lines.append(f"| {timing.tokens.get(n, n)} | " + " | ".join(f"{timing.peak_mb[(m, n)]:.0f}" for m in TIMING_METHODS) + " |")
    longest = lengths[-1]
    nx_s, nx_mb = timing.seconds[("normxlogit", longest)], timing.peak_mb[("normxlogit", longest)]
    slower = {m: timing.seconds[(m, longest)] / nx_s for m in TIMING_METHODS if m != "normxlogit"}
    lines += [
        "",
        f"At {timing.tokens.get(longest, longest)} tokens NormXLogit takes {nx_s:.3f} s and {nx_mb:.0f} MB; the others take "
        + ", ".join(f"{COST_NAMES[m]} {r:.1f}×" for m, r in slower.items())
        + " its time. The paper's Table 5 (largest batch within 48 GB of GPU memory, time per instance at that batch) "
        "is not reproduced as such: heedful sizes its batches by its memory estimator; the time per example of every "
        "method at the experiment's batching is the `s / example` column of each Experiment 1 table.",
        "",
    ]
    return lines


# ---------------------------------------------------------------------------- the paper's experiments
PAPER_EXPERIMENTS: tuple[tuple[str, str, str], ...] = (
    ("Exp. 1, SST-2, BERT-base (Table 1-3: AOPC, accuracy; Figures)", "analogue",
     "MiniLM-L6 fine-tuned on the movie snippets (Rotten Tomatoes sentences, SST's source), `[MASK]` removal; every "
     "method of the table, DecompX included"),
    ("Exp. 1, SST-2, Llama 2 with LoRA", "analogue",
     "the SmolLM2-135M classifier (`smollm2-sentiment`), deletion; DecompX added where the paper has N/A"),
    ("Exp. 1, STS-B regression (Table 1, Pearson; Eq. 8)", "analogue",
     "MiniLM regression on snippet ratings; DecompX as the norm of the final decomposed vectors, as the paper; Eq. 8 "
     "nearest first and, as extra rows, as printed (farthest first)"),
    ("Exp. 1, DeBERTa-v3 columns", "not reproduced",
     "no DeBERTa checkpoint ships here (heedful's DeBERTa-v2 adapter is tested on tiny random models only)"),
    ("Exp. 1, MNLI and QNLI columns", "not reproduced",
     "no NLI or QA data or classifier ships in any package obtainable here (MODELS.md)"),
    ("Value Zeroing global scores on SST-2 (A.2, Figure 6)", "analogue",
     "its rolled-out scores as a row of each Experiment 1 table"),
    ("Exp. 2, BLiMP evidence alignment per layer on RoBERTa (Figures 4-5)", "analogue",
     "generated agreement pairs (not BLiMP) on the causal `smollm2-135m`: LogAt(target / foil), NormXLogit, "
     "GlobEnc¬, ALTI¬, Value Zeroing¬, embedding norm, random at every layer"),
    ("Exp. 2, LogAt of the word \"plural\" (A.3, Figures 25-26)", "analogue",
     "the LogAt(plural) row of Experiment 2"),
    ("Exp. 2 on fine-tuned RoBERTa (A.3, Figures 27-28)", "not reproduced",
     "no masked LM ships here; the causal LM is not fine-tuned on the pairs"),
    ("Runtime by input length (Table 4)", "analogue", "MiniLM on CPU at 40-512 tokens, peak memory beside it"),
    ("Batch size within GPU memory and time per instance (Table 5)", "analogue (time only)",
     "time per example at the experiment's batching in each Experiment 1 table; no GPU, batches sized by the "
     "memory estimator"),
)


def experiments_section() -> list[str]:
    """Markdown: every experiment of the paper and whether this report reproduces it."""
    lines = ["## The paper's experiments here", "", "| experiment | here | how, or why not |", "|---|---|---|"]
    lines += [f"| {what} | {status} | {how} |" for what, status, how in PAPER_EXPERIMENTS]
    return lines + [""]


# ---------------------------------------------------------------------------- claims
SIGNED_NOT_COMPARABLE = "the paper's gradient rows are L1-aggregated; it never ran signed sums"


def _cmp_verdict(a: Any, b: Any, higher: bool, difference: tuple[float, float, float] | None = None,
                 not_comparable: str | None = None) -> Verdict:
    """The claim "``a`` is ahead of ``b``" (summaries): from the 95 % paired interval of the
    difference ``a - b`` where there is one (the two scored on the same examples), else from the
    two marginal intervals."""
    if difference is not None and all(math.isfinite(v) for v in difference):
        return difference_verdict(difference, higher, not_comparable=not_comparable)
    return interval_verdict((a.value, a.low, a.high), (b.value, b.low, b.high), higher, not_comparable=not_comparable)


def _layers_verdict(separated: int, ahead: int, layers: int, share: float = 0.8) -> Verdict:
    """A claim over layers ("almost all"): holds when ``separated`` layers reach ``share`` of them,
    not separated when only the direction does, else does not hold."""
    if separated >= share * layers:
        return Verdict(HOLDS)
    return Verdict(NOT_SEPARATED) if ahead >= share * layers else Verdict(DOES_NOT_HOLD)


def _headline(result: Any) -> str:
    return "pearson" if result.task == "regression" else "aopc"


def _cell(result: Any, key: str, metric: str) -> str:
    return f"{NAMES[key]} {summary_text(result.groups[key].summaries[metric], result.groups[key].seeds)}"


def _versus(result: Any, metric: str, where: str, claim: str, a: str, b: str, prefix: str = "",
            not_comparable: str | None = None) -> tuple[str, str, str, Verdict]:
    """The claim "``a`` is ahead of ``b``" on ``metric``: (claim, where, both cells and their paired
    difference, verdict)."""
    from heedful.evaluate.metrics import METRICS

    sa, sb = result.groups[a].summaries[metric], result.groups[b].summaries[metric]
    difference = bench_difference(result, a, b, metric)
    number = f"{_cell(result, a, metric)} vs {prefix}{_cell(result, b, metric)}"
    if all(math.isfinite(v) for v in difference):
        number += f"; paired difference {interval_text(*difference, sign=True)}"
    return claim, where, number, _cmp_verdict(sa, sb, METRICS[metric].higher_is_better, difference, not_comparable)


def _claims_exp1(results: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(claim, where, our number, verdict) of Experiment 1's claims on every case that ran."""
    from heedful.evaluate.metrics import METRICS

    rows: list[tuple[str, str, str, str]] = []
    for key, result in results.items():
        metric = _headline(result)
        higher = METRICS[metric].higher_is_better
        s = {k: g.summaries[metric] for k, g in result.groups.items()}
        where = f"`{key}`, {metric}"
        grads = [k for k in GRADIENT_ROWS if k in s]
        l1 = [k for k in GRADIENT_METHODS if k in s]
        signed = [k for k in GRADIENT_ROWS if k in s and k not in GRADIENT_METHODS]
        vs = [
            ("NormXLogit is more faithful than the gradient-based methods (abstract, §4.2, conclusion)",
             "normxlogit", ordering({k: s[k].value for k in l1}, higher)[0], "best L1 gradient row (the paper's) "),
        ]
        if signed:
            vs.append(("… against the signed-sum gradient rows (not the paper's)", "normxlogit",
                       ordering({k: s[k].value for k in signed}, higher)[0], "best signed gradient row ",
                       SIGNED_NOT_COMPARABLE))
        vs += [
            ("Weighting LogAt by the embedding norm makes it more faithful (§3.4)", "normxlogit", "logat", ""),
            ("The norm of the word embeddings identifies important tokens (§3.2; better than random)",
             "embedding_norm", "random", ""),
        ]
        if key == "minilm-sentiment" and "decompx" in s:
            vs.append(("On SST-2 (BERT) the architecture-specific DecompX is ahead of NormXLogit (§4.2, Table 1)",
                       "decompx", "normxlogit", ""))
        if result.task == "regression" and "decompx" in s:
            vs.append(("Regression: NormXLogit is ahead of the architecture-specific DecompX (§1, §4.2)",
                       "normxlogit", "decompx", ""))
            vs.append(("Regression (BERT): the embedding norm alone is ahead of DecompX (§4.2)", "embedding_norm", "decompx", ""))
        if result.task == "regression" and "normxlogit_far" in s:
            vs.append(("Eq. 8 as printed (largest distance from the prediction first) ranks important tokens "
                       "(better than random)", "normxlogit_far", "random", ""))
        rows += [_versus(result, metric, where, *claim) for claim in vs]
        if key == DECODER_CLASSIFIER:
            curves = {k: result.groups[k].summaries[metric].curve for k in (*grads, "random", "normxlogit")}
            mask = result.spec.protocol.mean_mask
            ahead = [bool(curves["normxlogit"][j] > max(curves[k][j] for k in curves if k != "normxlogit"))
                     for j in np.flatnonzero(mask)]
            rows.append(("Llama 2: NormXLogit has a higher AOPC than the gradient methods and random at every "
                         "perturbation ratio (§4.2, Figure 2)", where,
                         f"ahead at {sum(ahead)} of {len(ahead)} ratios (means over examples)",
                         Verdict(HOLDS if all(ahead) else DOES_NOT_HOLD)))
    return rows


def _claims_cost(results: dict[str, Any], timing: Timing | None) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    first = next(iter(results.values()), None)
    if first is not None:
        cost = first.groups["normxlogit"].cost
        ok = cost["backward"] == 0 and cost["forward"] <= 1.0
        rows.append(("NormXLogit needs a single forward pass and no backward pass (§4.2)",
                     f"`{first.model_name}`, Experiment 1",
                     f"{fmt(cost['forward'], digits=2)} forward and {fmt(cost['backward'], digits=2)} backward passes per example",
                     Verdict(HOLDS if ok else DOES_NOT_HOLD)))
    if timing is not None:
        long = [n for n in sorted(timing.repeats) if n >= 360]
        others = [m for m in TIMING_METHODS if m != "normxlogit"]
        for what, table, unit in (("faster", timing.seconds, "time"), ("more memory-efficient", timing.peak_mb, "peak memory")):
            if not long:
                rows.append((f"For inputs of 360 tokens or more NormXLogit is {what} than its counterparts (§4.2, Tables 4-5)",
                             "cost section", "no input of 360 tokens or more in this run", Verdict(CANNOT_BE_TESTED)))
                continue
            ratios = {n: min(table[(m, n)] / max(table[("normxlogit", n)], 1e-9) for m in others) for n in long}
            rows.append((f"For inputs of 360 tokens or more NormXLogit is {what} than its counterparts (§4.2, Tables 4-5)",
                         f"`{timing.model_name}`, cost section",
                         "; ".join(f"{timing.tokens.get(n, n)} tokens: the closest other method takes {r:.1f}× its {unit}"
                                   for n, r in ratios.items()),
                         Verdict(HOLDS if all(r > 1 for r in ratios.values()) else DOES_NOT_HOLD)))
    return rows


def _claims_exp2(al: Alignment | None) -> list[tuple[str, str, str, str]]:
    if al is None:
        return []
    idx = {m: EXP2_METHODS.index(m) for m in EXP2_METHODS}
    where = f"`{al.model_name}`, agreement pairs, AP"
    ap, low, high = al.ap, al.ap_low, al.ap_high
    nx, others = idx["normxlogit"], [idx[m] for m in ("globenc", "alti", "value_zeroing")]
    ahead = int((ap[nx] > ap[others].max(axis=0)).sum())
    separated = int((low[nx] > high[others].max(axis=0)).sum()) if low is not None and high is not None else 0
    rows = [("NormXLogit outperforms GlobEnc¬, ALTI¬ and Value Zeroing¬ across almost all layers (§5.2, Figure 4; "
             "tested: ≥ 80 % of layers)", where,
             f"ahead of all three at {ahead} of {al.layers} layers ({separated} with separated intervals)",
             _layers_verdict(separated, ahead, al.layers))]
    t, f = idx["logat_target"], idx["logat_foil"]
    above = int((ap[t] > ap[f]).sum())
    above_sep = int((low[t] > high[f]).sum()) if low is not None and high is not None else 0
    rows.append(("LogAt(foil) aligns lower than LogAt(target) (§5.2; tested at ≥ 80 % of layers)", where,
                 f"LogAt(target) above at {above} of {al.layers} layers ({above_sep} with separated intervals)",
                 _layers_verdict(above_sep, above, al.layers)))
    third = max(1, al.layers // 3)
    rise = float(np.mean(ap[t, -third:]) - np.mean(ap[t, :third]))
    fall = float(np.mean(ap[f, -third:]) - np.mean(ap[f, :third]))
    first, last = 0, al.layers - 1
    if low is not None and high is not None:
        def at(row: int, layer: int) -> tuple[float, float, float]:
            return float(ap[row, layer]), float(low[row, layer]), float(high[row, layer])

        depth = all_of([interval_verdict(at(t, last), at(t, first)), interval_verdict(at(f, first), at(f, last))])
    else:
        depth = Verdict(CANNOT_BE_TESTED, "no per-layer intervals")
    rows.append(("With depth the target's alignment rises and the foil's drops (§5.2)", where,
                 f"last third minus first third of layers: LogAt(target) {rise:+.3f}, LogAt(foil) {fall:+.3f}; "
                 f"layer {last + 1} vs layer {first + 1} (intervals): LogAt(target) {alignment_cell(al, 'ap', t, last)} vs "
                 f"{alignment_cell(al, 'ap', t, first)}, LogAt(foil) {alignment_cell(al, 'ap', f, last)} vs "
                 f"{alignment_cell(al, 'ap', f, first)}",
                 depth))
    p = idx["logat_plural"]
    if np.isfinite(ap[p]).any():
        rest = [idx[m] for m in EXP2_METHODS if m not in ("logat_plural", "random")]
        pl = int(np.nanargmax(ap[p]))
        flat = ap[rest]
        br, bl = (int(v) for v in np.unravel_index(np.nanargmax(flat), flat.shape))
        other = rest[br]
        if low is not None and high is not None:
            plural = interval_verdict((ap[p, pl], low[p, pl], high[p, pl]), (flat[br, bl], low[other, bl], high[other, bl]))
        else:
            plural = Verdict(CANNOT_BE_TESTED, "no per-layer intervals")
        rows.append(('LogAt of the word "plural" outperforms all other methods by a notable margin (§5.2, A.3)', where,
                     f"best LogAt(plural) {alignment_cell(al, 'ap', p, pl)} at layer {pl + 1} vs best other "
                     f"{EXP2_NAMES[EXP2_METHODS[other]]} {alignment_cell(al, 'ap', other, bl)} at layer {bl + 1}",
                     plural))
    return rows


UNTESTABLE = (
    ("MNLI: NormXLogit ahead of the gradient methods on Llama 2 and BERT, integrated gradients slightly ahead on DeBERTa "
     "(§4.2, Table 1)", "no NLI data or classifier ships here"),
    ("QNLI: NormXLogit consistently ahead of the architecture-agnostic methods (§4.2, Table 1)",
     "no QA data or classifier ships here"),
    ("DeBERTa-v3 columns of Table 1", "no DeBERTa checkpoint ships here"),
    ("Alignment on RoBERTa fine-tuned on the BLiMP pairs (A.3)", "no masked LM ships here; BLiMP itself is not available"),
)


def claims_section(results: dict[str, Any], al: Alignment | None, timing: Timing | None) -> list[str]:
    """Markdown: every claim of the paper with this run's number and a verdict."""
    rows = _claims_exp1(results) + _claims_cost(results, timing) + _claims_exp2(al)
    rows += [(claim, "–", why, Verdict(CANNOT_BE_TESTED)) for claim, why in UNTESTABLE]
    lines = [
        "## The paper's claims against this run",
        "",
        LEGEND + " Claims over layers or ratios: counted as stated in the row. Every number below is computed in this "
        "run (Experiment 1: on our analogue models and data, so a verdict speaks for them, not for the paper's models).",
        "",
        "| claim (paper) | where tested | our number | verdict |",
        "|---|---|---|---|",
    ]
    lines += [f"| {claim} | {where} | {number} | **{verdict.word}**{f' ({verdict.reason})' if verdict.reason else ''} |"
              for claim, where, number, verdict in rows]
    return lines + [""]


# ---------------------------------------------------------------------------- the report
def write(out_dir: Path, settings: ReportSettings) -> Path:
    """Run both experiments and write ``out_dir/normxlogit.md`` with its PNG plots (see the module
    docstring). In quick mode the report is ``normxlogit-quick.md``, so a smoke run never
    overwrites the real one."""
    import torch

    from heedful import zoo

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    quick = settings.quick
    n = settings.n or (QUICK_N if quick else DEFAULT_N)
    ig_steps = int(_option(settings, "ig_steps", QUICK_IG_STEPS if quick else DEFAULT_IG_STEPS))
    ig_steps_decoder = int(_option(settings, "ig_steps_decoder", QUICK_IG_STEPS if quick else DEFAULT_IG_STEPS_DECODER))
    n_decoder = int(_option(settings, "n_decoder", min(n, DEFAULT_N_DECODER)))
    n_agreement = int(_option(settings, "n_agreement", QUICK_N_AGREEMENT if quick else DEFAULT_N_AGREEMENT))
    n_regression = int(_option(settings, "n_regression", min(n, DEFAULT_N_REGRESSION)))
    random_seeds = int(_option(settings, "random_seeds", DEFAULT_RANDOM_SEEDS))
    batch_size = int(_option(settings, "batch_size", 16))
    aggregate = gradient_aggregation()
    began = time.perf_counter()

    lines = [
        "# NormXLogit reproduction",
        "",
        f"{PAPER} (specs/methods.md §2): faithfulness of NormXLogit, LogAt and gradient methods (Experiment 1) "
        "and layer-wise alignment with known evidence (Experiment 2), re-run on heedful's zoo models.",
        "",
        f"Regenerate with `heedful reproduce normxlogit{' --quick' if quick else ''}"
        + (f" --n {settings.n}" if settings.n else "")
        + "".join(f" -O {k}={v}" for k, v in sorted(settings.options.items()))
        + "` "
        f"(results store: `{store_dir(settings)}`; a rerun reuses stored explanations). "
        f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
    ]
    if quick:
        lines += ["> **Quick smoke run**: a handful of examples and few IG steps; the numbers are not the report's.", ""]
    lines += [
        "**What differs from the paper.** Our models are small (MiniLM-L6 fine-tuned on movie snippets in place of "
        "BERT-base / DeBERTa on SST-2; a SmolLM2-135M classifier in place of Llama-2-7B with LoRA; MiniLM regression "
        "on snippet ratings in place of STS-B). The data are the VADER movie-review snippets, not SST-2 / STS-B, so "
        "only the *ordering* of methods is comparable with the paper, not the numbers. DecompX runs with the "
        "reference's defaults (biases shared by `absdot`, feed-forward blocks and the classification head included; "
        "for regression, as the paper, the norm of the final layer's decomposed vectors); the paper has no DecompX "
        "number for Llama 2 (it calls DecompX BERT-specific), heedful's decomposes the SmolLM2 classifier too. Value "
        "Zeroing (rolled out) is the paper's appendix A.2 Figure 6 baseline, which it shows only as a curve. "
        f"Integrated gradients uses {ig_steps} steps on MiniLM and {ig_steps_decoder} on "
        f"SmolLM2 (the paper: 50 for BERT, 25 for Llama 2). Examples: {n} (sentiment classifiers; "
        f"{n_decoder} for the decoder), {n_regression} (regression), {n_agreement} agreement pairs; the random "
        f"baseline runs with {random_seeds} seeds. These sizes fit a shared two-core CPU in about two hours; "
        "`--n 500 --option n_regression=500` (and more `random_seeds`) give larger samples, reusing what is stored.",
        "",
        "## Experiment 1: faithfulness",
        "",
        "AOPC is the mean drop of the predicted class's probability when the top K % of tokens (special tokens "
        "counted, [CLS] never removed) are removed, averaged over K = 10..90 % (higher is better); accuracy is that of "
        "the perturbed predictions against the gold labels (lower is better); for regression the Pearson correlation "
        "of the perturbed outputs with the gold ratings (lower is better) and its drop from the unperturbed "
        "correlation (higher is better).",
        "",
    ]
    timings: list[tuple[str, float]] = []
    explaining: dict[str, float] = {}
    results: dict[str, Any] = {}
    al: Alignment | None = None
    timing: Timing | None = None
    for case in CASES:
        lines += [f"### {case.key}" + (" (decoder)" if case.decoder else ""), ""]
        ok, why = _model_available(case.model)
        later = "once it is built"
        if ok and case.decoder and n_decoder < 1:
            ok, why, later = False, (
                "the model is built but was left out of this run (`--option n_decoder=0`) to fit its time budget: "
                "every example costs about 10 removal ratios × 8 method runs forward passes plus integrated "
                "gradients' passes, at roughly ten times MiniLM's cost per pass"
            ), "without that option"
        if not ok:
            lines += [f"**Not run**: {why}. Rerun `heedful reproduce normxlogit` {later} to fill this "
                      f"section (compared with the paper's {case.column_name} column).", ""]
            timings.append((case.key, float("nan")))
            continue
        steps = ig_steps_decoder if case.decoder else ig_steps
        count = n_decoder if case.decoder else (n_regression if "pearson" in case.metrics else n)
        result, wall, plots = run_case(case, settings, out_dir, count, steps, aggregate, batch_size, random_seeds)
        timings.append((case.key, wall))
        results[case.key] = result
        explaining[case.key] = sum(
            g.cost["seconds"] * g.seeds for g in result.groups.values() if math.isfinite(g.cost["seconds"])
        ) * result.n_examples
        lines += case_section(case, result, wall, plots, steps, aggregate)

    lines += ["## Experiment 2 analogue: layer-wise evidence alignment", ""]
    ok, why = _model_available(LM)
    if not ok:
        lines += [f"**Not run**: {why}.", ""]
        timings.append(("alignment", float("nan")))
    else:
        start = time.perf_counter()
        al = run_alignment(settings, n_agreement, batch_size)
        stem = "normxlogit-quick-" if quick else "normxlogit-"
        plot = plot_alignment(al, out_dir / f"{stem}alignment.png")
        timings.append(("alignment", time.perf_counter() - start))
        lines += alignment_section(al, plot)
        if al.lens is not None:
            lines += lens_section(al, plot_lens(al, out_dir / f"{stem}logit-lens.png"))

    lines += ["## Cost: the paper's Tables 4-5 on our models", ""]
    start = time.perf_counter()
    ok, why = _model_available(TIMING_MODEL)
    if ok:
        timing = run_timing(ig_steps, quick)
        lines += timing_section(timing)
    else:
        lines += [f"**Not run**: {why}.", ""]
    timings.append(("cost", time.perf_counter() - start if ok else float("nan")))
    lines += experiments_section()

    total = time.perf_counter() - began
    lines += ["## Run", "", "| section | wall time of this run | explaining, when first computed |", "|---|---|---|"]
    for k, v in timings:
        first = explaining.get(k)
        first_text = f"{first / 60:.1f} min" if first is not None else ("–" if k != "alignment" or not math.isfinite(v) else "")
        if k == "alignment" and math.isfinite(v):
            first_text = f"{al.seconds / 60:.1f} min (all of it)"
        lines.append(f"| {k} | {'not run' if not math.isfinite(v) else f'{v / 60:.1f} min'} | {first_text} |")
    lines += [f"| total | {total / 60:.1f} min | |", "",
              f"Zoo models: {', '.join(f'`{m}`' for m in zoo.ENTRIES)}. Wall times on a shared CPU ({torch.get_num_threads()} torch thread(s)); "
              "a rerun reuses the stored explanations and perturbation measurements. The last column sums the stored "
              "cost of explaining (perturbing and re-scoring for the metrics comes on top).", ""]
    lines += claims_section(results, al, timing)
    path = out_dir / ("normxlogit-quick.md" if quick else "normxlogit.md")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
