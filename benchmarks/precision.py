"""Lower-precision forward passes (bf16, int8) against float32: speed and what they change.

On the first ``--n`` sentences of the movies test split and the zoo model ``minilm-sentiment``
this script

1. computes explanations once, in float32, with ``--methods`` (the predicted class);
2. evaluates AOPC comprehensiveness of all of them (one ``evaluate`` call, protocol
   ``--preset``) with ``precision="fp32"``, ``"bf16"`` and ``"int8"``, runs interleaved, and
   reports the speed-up against fp32, the per-example deviation (max and mean ``|Delta AOPC|``
   over every method's explanations) and whether the methods keep their order: the Spearman
   correlation of the methods' mean AOPC at fp32 and at the lower precision, with a 95 %
   bootstrap interval over examples (the same resamples for both precisions);
3. times LIME and leave-one-out at the three precisions on the first ``--explain-n`` sentences
   and reports their speed-up and how far the scores move (largest ``|Delta score|`` relative to
   the example's largest fp32 score, and the median per-example Spearman correlation of the
   token scores with fp32's);
4. writes ``--out`` (Markdown) and prints it.

Timing: ``torch.set_num_threads(--threads)``, a warm-up (which also builds the low-precision
copies; their build time is reported apart), then ``--repeats`` timed runs (median), precisions
interleaved. On a shared machine run with ``OMP_WAIT_POLICY=PASSIVE``.

    python benchmarks/precision.py [--model minilm-sentiment] [--n 500] [--explain-n 100]
        [--methods ...] [--preset default] [--repeats 1] [--threads 1]
        [--out benchmarks/results/precision.md] [--tiny]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from _shared import finish, fmt_s, library_versions, machine_lines, measure, precision_note, start  # noqa: E402  (benchmarks/ is the script's folder)
from rich.console import Console
from scipy.stats import spearmanr

import heedful
from heedful.engine.precision import support
from heedful.evaluate import evaluate
from heedful.evaluate.intervals import bootstrap_indices, percentile_interval
from heedful.evaluate.protocol import CURVES_TOLERATE

HERE = Path(__file__).resolve().parent
PRECISIONS = ("fp32", "bf16", "int8")
LOWER = ("bf16", "int8")


def aopc_values(model: heedful.Model, explanations: list[heedful.Explanation], preset: str, precision: str) -> np.ndarray:
    result = evaluate(model, explanations, ["aopc"], preset, batch_size=len(explanations), precision=precision)
    return result["aopc"].per_example.values


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def ordering_agreement(fp32: np.ndarray, low: np.ndarray, n_boot: int = 1000) -> tuple[float, float, float, bool]:
    """Spearman correlation of the methods' mean AOPC (``[n, M]`` per example and method) at
    fp32 and at the lower precision, its 95 % bootstrap interval over examples, and whether the
    order of the means is the same."""
    point = spearman(fp32.mean(axis=0), low.mean(axis=0))
    same = bool((np.argsort(-fp32.mean(axis=0), kind="stable") == np.argsort(-low.mean(axis=0), kind="stable")).all())
    idx = bootstrap_indices(fp32.shape[0], n_boot)
    boots = np.array([spearman(fp32[i].mean(axis=0), low[i].mean(axis=0)) for i in idx])
    low_ci, high_ci = percentile_interval(boots)
    return point, low_ci, high_ci, same


def score_change(base: list[heedful.Explanation], low: list[heedful.Explanation]) -> tuple[float, float]:
    """Largest ``|Delta score|`` relative to the example's largest fp32 ``|score|``, and the
    median per-example Spearman correlation of the token scores."""
    rel, rho = [], []
    for a, b in zip(base, low, strict=True):
        sa, sb = np.asarray(a.scores, dtype=float), np.asarray(b.scores, dtype=float)
        scale = np.abs(sa).max()
        rel.append(np.abs(sa - sb).max() / scale if scale > 0 else 0.0)
        keep = sa != 0  # special tokens score 0 at every precision
        if keep.sum() >= 2:
            rho.append(spearman(sa[keep], sb[keep]))
    return float(np.max(rel)), float(np.nanmedian(rho))


def run(model: heedful.Model, texts: list[str], args: argparse.Namespace, console: Console) -> dict[str, Any]:
    adapter = model.adapter
    began = time.perf_counter()
    for p in LOWER:
        adapter.at_precision(p)
    build = time.perf_counter() - began
    explanations: dict[str, list[heedful.Explanation]] = {}
    for name in args.methods:
        console.print(f"[dim]explaining with {name} (fp32) ...[/dim]")
        explanations[name] = model.explain(texts, name, batch_size=32)
    joint = [explanations[name][i] for i in range(len(texts)) for name in args.methods]
    console.print(f"[dim]AOPC of {len(joint)} explanations at {', '.join(PRECISIONS)} ...[/dim]")
    warm = joint[: 4 * len(args.methods)]
    timed = measure(
        {p: (lambda p=p: aopc_values(model, joint, args.preset, p)) for p in PRECISIONS},
        args.repeats,
        warmups={p: (lambda p=p: aopc_values(model, warm, args.preset, p)) for p in PRECISIONS},
    )
    values = {p: timed[p].result.reshape(len(texts), len(args.methods)) for p in PRECISIONS}
    aopc = {}
    for p in LOWER:
        delta = np.abs(values[p] - values["fp32"])
        aopc[p] = {
            "time": timed[p].median,
            "speedup": timed["fp32"].median / timed[p].median,
            "max": float(delta.max()),
            "mean": float(delta.mean()),
            "per_method_mean": delta.mean(axis=0),
            "agreement": ordering_agreement(values["fp32"], values[p]),
        }
    explain_texts = texts[: args.explain_n]
    explained = {}
    for name in ("lime", "leave_one_out"):
        console.print(f"[dim]{name} on {len(explain_texts)} sentences at {', '.join(PRECISIONS)} ...[/dim]")
        fns = {p: (lambda p=p, name=name: model.explain(explain_texts, name, batch_size=32, precision=p)) for p in PRECISIONS}
        warm_fns = {p: (lambda p=p, name=name: model.explain(explain_texts[:2], name, precision=p)) for p in PRECISIONS}
        t = measure(fns, args.repeats, warmups=warm_fns)
        explained[name] = {
            p: {
                "time": t[p].median,
                "speedup": t["fp32"].median / t[p].median,
                "change": score_change(t["fp32"].result, t[p].result) if p != "fp32" else (0.0, 1.0),
            }
            for p in PRECISIONS
        }
    return {
        "build": build,
        "aopc_fp32": timed["fp32"].median,
        "means": {p: values[p].mean(axis=0) for p in PRECISIONS},
        "aopc": aopc,
        "explained": explained,
        "joint_n": len(joint),
    }


def machine_note() -> list[str]:
    """A note under the title when this processor lacks the instructions bf16 or int8 needs to be
    fast (:func:`_shared.precision_note`), saying what the times below do and do not show."""
    notes = [note for p in LOWER if (note := precision_note(p))]
    if not notes:
        return []
    return [
        "**Note: this processor lacks instructions lower precision depends on.** " + " ".join(notes) + " "
        "The times below are this processor's: without bfloat16 arithmetic (AVX-512 BF16 or AMX on x86, "
        "compute capability 8.0 on CUDA) every bfloat16 product is converted to float32 in software, "
        "several times slower than float32 itself; with it bf16 runs about twice as fast as fp32 (see this "
        "file's history for a run on a processor with AVX-512 BF16). `precision=\"auto\"` picks "
        f"{support().auto(CURVES_TOLERATE)} for the curves and LIME here. The deviation columns measure "
        "rounding, not speed: they hold on any processor, up to the order of summation.",
        "",
    ]


def render(found: dict[str, Any], info: list[str], args: argparse.Namespace, n: int) -> str:
    methods = args.methods
    lines = [
        "# Lower-precision forward passes: bf16 and int8 against fp32",
        "",
        *machine_note(),
        f"## AOPC comprehensiveness ({n} sentences x {len(methods)} methods = {found['joint_n']} explanations, preset `{args.preset}`)",
        "",
        "`evaluate(model, explanations, [\"aopc\"], preset, precision=...)`, all explanations in one call; "
        "the explanations are the same (computed once at fp32), only the curves' forward passes change.",
        "",
        "| precision | time | speed-up vs fp32 | max abs Delta AOPC (per example) | mean abs Delta AOPC | Spearman of method means vs fp32 [95% CI] | method order |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| fp32 | {fmt_s(found['aopc_fp32'])} | 1.00x | | | | |",
    ]
    for p in LOWER:
        r = found["aopc"][p]
        rho, lo, hi, same = r["agreement"]
        lines.append(
            f"| {p} | {fmt_s(r['time'])} | **{r['speedup']:.2f}x** | {r['max']:.4f} | {r['mean']:.5f} | "
            f"{rho:.3f} [{lo:.3f}, {hi:.3f}] | {'unchanged' if same else 'changed'} |"
        )
    lines += [
        "",
        "Mean AOPC per method (and mean abs Delta per example against fp32):",
        "",
        "| method | fp32 | bf16 | int8 | mean abs Delta bf16 | mean abs Delta int8 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for j, name in enumerate(methods):
        means = found["means"]
        lines.append(
            f"| {name} | {means['fp32'][j]:.4f} | {means['bf16'][j]:.4f} | {means['int8'][j]:.4f} | "
            f"{found['aopc']['bf16']['per_method_mean'][j]:.5f} | {found['aopc']['int8']['per_method_mean'][j]:.5f} |"
        )
    lines += [
        "",
        f"## LIME and leave-one-out ({min(args.explain_n, n)} sentences)",
        "",
        "| method | precision | time | speed-up vs fp32 | max abs Delta score / max abs fp32 score | median Spearman of token scores vs fp32 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, rows in found["explained"].items():
        for p in PRECISIONS:
            r = rows[p]
            change = "" if p == "fp32" else f"{r['change'][0]:.3f}"
            rho = "" if p == "fp32" else f"{r['change'][1]:.4f}"
            lines.append(f"| {name} | {p} | {fmt_s(r['time'])} | {r['speedup']:.2f}x | {change} | {rho} |")
    lines += [
        "",
        f"Building the low-precision copies (bf16 and int8, once per model): {fmt_s(found['build'])}.",
        "",
        "bf16: a bfloat16 copy of the model (weights and activations; layer norms and softmax "
        "accumulate in float32 inside their kernels), logits returned in float32. int8: "
        "`torch.ao.quantization.quantize_dynamic` of every linear layer (int8 weights per tensor, "
        "activations quantised per batch). Leave-one-out's original output runs at the same "
        "precision as its perturbed copies.",
        "",
        "## Machine",
        "",
        *info,
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-sentiment", help="zoo name or model directory")
    parser.add_argument("--n", type=int, default=500, help="number of held-out sentences for AOPC")
    parser.add_argument("--explain-n", type=int, default=100, help="sentences LIME and leave-one-out are timed on")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["random", "saliency", "grad_x_input", "raw_attention", "normxlogit", "leave_one_out"],
        help="methods whose (fp32) explanations are evaluated",
    )
    parser.add_argument("--preset", default="default", help="protocol preset of the AOPC evaluation")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per measurement (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "precision.md")
    parser.add_argument("--tiny", action="store_true", help="a tiny random BERT and corpus instead (script debugging)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    console, model, texts, load_before = start(args)
    found = run(model, texts, args, console)
    versions = library_versions("torch", "transformers", "heedful")
    info = machine_lines(model, args, texts, (load_before, os.getloadavg()[0]), versions, f", {model.adapter.config._attn_implementation} attention")
    text = render(found, [*info, f"- uptime before the run: `{uptime}`"], args, len(texts))
    return finish(text, args, console)


if __name__ == "__main__":
    raise SystemExit(main())
