"""AOPC comprehensiveness under heedful's ``ferret`` protocol, against ferret itself.

On the first ``--n`` sentences of the movies test split and the zoo model ``minilm-sentiment``
this script

1. computes explanations once with heedful (``--methods``, by default gradient x input,
   integrated gradients and NormXLogit; the predicted class is explained);
2. evaluates AOPC comprehensiveness of exactly those explanations twice: with heedful
   (``heedful.evaluate.evaluate(..., ["aopc"], "ferret")``, every explanation of a method in
   one call) and with ferret's own evaluator (``AOPC_Comprehensiveness_Evaluation`` from
   ferret-xai, one ``compute_evaluation`` per explanation with its default arguments -- the
   call ``Benchmark.evaluate_explanation`` makes), handing it each explanation as a ferret
   ``Explanation`` (text, tokens, scores, target = the explained class);
3. reports per method the largest per-example absolute difference and the mean AOPC of both,
   the wall time of both (same process, same model object, same thread count, runs
   interleaved) and how many token positions each side ran through the model (padding
   included), and times heedful once more on the explanations of all methods in one call
   (example-major order, so that texts two methods' rationales reduce to the same string run
   once);
4. times heedful's evaluation again at ``precision="bf16"`` and ``"int8"`` (forward passes of
   a low-precision copy of the model, :mod:`heedful.engine.precision`) interleaved with the fp32 and
   ferret runs above, per method and with all methods in one call, and reports their ratios to
   ferret, their per-example ``|Delta AOPC|`` against fp32 and whether the methods keep their
   order of mean AOPC;
5. writes a markdown report to ``--out`` and prints it.

ferret-xai (0.4.2) pins ``transformers<5`` and ``numpy<2``; heedful needs transformers 5. Its
evaluators need neither pin, so it is installed without its dependencies
(``pip install --no-deps ferret-xai``; see the ``bench`` extra in pyproject.toml), and its
evaluator modules are imported without running the package's ``__init__`` (which imports its
explainers and dataset loaders: shap, lime, datasets, seaborn, opencv ...). The evaluator code
that runs is ferret's, unchanged.

Timing: ``torch.set_num_threads(--threads)`` for both sides; a warm-up on a few explanations,
then ``--repeats`` timed runs (median), sides interleaved. On a shared machine run with
``OMP_WAIT_POLICY=PASSIVE``.

    python benchmarks/ferret_aopc.py [--model minilm-sentiment] [--n 200]
        [--methods grad_x_input integrated_gradients normxlogit] [--ig-steps 20]
        [--repeats 1] [--threads 1] [--out benchmarks/results/ferret_aopc.md] [--tiny]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _shared import finish, fmt_s, library_versions, machine_lines, precision_note, start  # noqa: E402  (benchmarks/ is the script's folder)
from rich.console import Console

import heedful
from heedful.evaluate import evaluate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SPEED_TARGET = 4.0  # heedful's evaluation at bf16 >= 4x faster than ferret's
AGREEMENT = 1e-5  # largest per-example |heedful - ferret| accepted as float rounding (fp32)
DELTA_TARGET = 0.005  # mean per-example |AOPC bf16 - AOPC fp32|
LOWER = ("bf16", "int8")


# ---------------------------------------------------------------------------------- ferret
def ferret_evaluator_classes() -> tuple[type, type]:
    """ferret's ``AOPC_Comprehensiveness_Evaluation`` and ``Explanation``, imported from the
    installed package without executing ``ferret/__init__.py``."""
    spec = importlib.util.find_spec("ferret")
    if spec is None or spec.submodule_search_locations is None:
        raise SystemExit("ferret-xai is not installed: pip install --no-deps ferret-xai==0.4.2")
    if "ferret" not in sys.modules:
        package = types.ModuleType("ferret")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["ferret"] = package
    from ferret.evaluators.faithfulness_measures import AOPC_Comprehensiveness_Evaluation
    from ferret.explainers.explanation import Explanation

    return AOPC_Comprehensiveness_Evaluation, Explanation


class PositionCounter:
    """Counts the token positions that go through the model's backbone (both sides call it):
    (rows x padded length) cells, and the real (unpadded) positions among them."""

    def __init__(self, model: heedful.Model) -> None:
        self.cells = self.real = 0
        # the float32 model and its low-precision copies (heedful.engine.precision)
        models = [model.hf_model, *(model.adapter.at_precision(p).hf_model for p in LOWER)]
        self.handles = [m.base_model.register_forward_pre_hook(self._hook, with_kwargs=True) for m in models]

    def _hook(self, module, args, kwargs) -> None:
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids")
        if ids is None:
            ids = kwargs.get("inputs_embeds") if args == () else args[0]
        shape = tuple(mask.shape) if mask is not None else tuple(ids.shape[:2])
        self.cells += shape[0] * shape[1]
        self.real += int(mask.sum()) if mask is not None else shape[0] * shape[1]

    def take(self) -> tuple[int, int]:
        found, self.cells, self.real = (self.cells, self.real), 0, 0
        return found


# ---------------------------------------------------------------------------------- timing
@dataclass
class Timing:
    times: list[float] = field(default_factory=list)
    cells: tuple[int, int] = (0, 0)
    result: Any = None

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def measure(fns: dict[str, Callable[[], Any]], repeats: int, counter: PositionCounter) -> dict[str, Timing]:
    """Time each function ``repeats`` times, interleaved (order reversed every other round)."""
    names = list(fns)
    timings = {name: Timing() for name in names}
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            counter.take()
            began = time.perf_counter()
            result = fns[name]()
            timings[name].times.append(time.perf_counter() - began)
            timings[name].cells = counter.take()
            timings[name].result = result
    return timings




# ---------------------------------------------------------------------------------- setup
def method_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    return {"n_steps": args.ig_steps} if name == "integrated_gradients" else {}


# ---------------------------------------------------------------------------------- compare
def heedful_aopc(model: heedful.Model, explanations: list[heedful.Explanation], precision: str = "fp32") -> np.ndarray:
    result = evaluate(model, explanations, ["aopc"], "ferret", batch_size=len(explanations), precision=precision)
    return result["aopc"].per_example.values


def ferret_aopc(evaluator, ferret_explanation: type, explanations: list[heedful.Explanation]) -> np.ndarray:
    values = []
    for e in explanations:
        target = int(e.target.indices[0])
        given = ferret_explanation(e.text, list(e.tokens), np.asarray(e.scores, dtype=float), e.method, target)
        values.append(float(evaluator.compute_evaluation(given, target=target).score))
    return np.asarray(values)


def compare(model: heedful.Model, texts: list[str], args: argparse.Namespace, console: Console) -> dict[str, Any]:
    aopc_class, ferret_explanation = ferret_evaluator_classes()
    evaluator = aopc_class(model.hf_model, model.tokenizer)
    counter = PositionCounter(model)
    explanations: dict[str, list[heedful.Explanation]] = {}
    explain_time: dict[str, float] = {}
    for name in args.methods:
        console.print(f"[dim]explaining with {name} ...[/dim]")
        began = time.perf_counter()
        explanations[name] = model.explain(texts, name, batch_size=32, **method_options(name, args))
        explain_time[name] = time.perf_counter() - began
    # warm-up: a few explanations through both sides (and the low-precision copies built)
    warm = explanations[args.methods[0]][:4]
    for precision in ("fp32", *LOWER):
        heedful_aopc(model, warm, precision)
    ferret_aopc(evaluator, ferret_explanation, warm)
    rows = []
    for name in args.methods:
        console.print(f"[dim]evaluating {name}: heedful and ferret ...[/dim]")
        expl = explanations[name]
        timed = measure(
            {
                "heedful": lambda expl=expl: heedful_aopc(model, expl),
                **{p: (lambda expl=expl, p=p: heedful_aopc(model, expl, p)) for p in LOWER},
                "ferret": lambda expl=expl: ferret_aopc(evaluator, ferret_explanation, expl),
            },
            args.repeats,
            counter,
        )
        ours, theirs = timed["heedful"].result, timed["ferret"].result
        diff = np.abs(ours - theirs)
        content = [np.asarray(e.scores, dtype=float)[1:-1] for e in expl]
        no_rationale = sum(1 for c in content if not (c > 0).any())
        tied = sum(1 for c in content if len(np.unique(c[c > 0])) < int((c > 0).sum()))
        rows.append(
            {
                "method": name,
                "n": len(expl),
                "max_diff": float(diff.max()),
                "worst": int(diff.argmax()),
                "mean_heedful": float(ours.mean()),
                "mean_ferret": float(theirs.mean()),
                "heedful": timed["heedful"].median,
                "ferret": timed["ferret"].median,
                "cells_heedful": timed["heedful"].cells[0],
                "cells_ferret": timed["ferret"].cells[0],
                "real_heedful": timed["heedful"].cells[1],
                "real_ferret": timed["ferret"].cells[1],
                "explain": explain_time[name],
                "no_rationale": no_rationale,
                "tied": tied,
                "values": ours,
                **{p: timed[p].median for p in LOWER},
                **{f"values_{p}": timed[p].result for p in LOWER},
                **{f"cells_{p}": timed[p].cells[0] for p in LOWER},
            }
        )
        console.print(
            f"  max diff {diff.max():.1e}; mean {ours.mean():.6f} / {theirs.mean():.6f}; "
            f"heedful {fmt_s(timed['heedful'].median)}, ferret {fmt_s(timed['ferret'].median)}"
        )
    # every method's explanations in one heedful call, example-major
    joint = [explanations[name][i] for i in range(len(texts)) for name in args.methods]
    console.print("[dim]evaluating all methods in one heedful call ...[/dim]")
    timed = measure(
        {"joint": lambda: heedful_aopc(model, joint), **{p: (lambda p=p: heedful_aopc(model, joint, p)) for p in LOWER}},
        args.repeats,
        counter,
    )
    joint_values = timed["joint"].result.reshape(len(texts), len(args.methods))
    joint_diff = max(
        float(np.abs(joint_values[:, j] - row["values"]).max()) for j, row in enumerate(rows)
    )
    for handle in counter.handles:
        handle.remove()
    return {
        "rows": rows,
        "joint": timed["joint"].median,
        "joint_cells": timed["joint"].cells[0],
        "joint_values": joint_values,
        "joint_diff": joint_diff,
        **{f"joint_{p}": timed[p].median for p in LOWER},
        **{f"joint_cells_{p}": timed[p].cells[0] for p in LOWER},
        **{f"joint_values_{p}": timed[p].result.reshape(len(texts), len(args.methods)) for p in LOWER},
    }


# ---------------------------------------------------------------------------------- report
def machine_info(
    model: heedful.Model, args: argparse.Namespace, texts: list[str], loads: tuple[float, float]
) -> list[str]:
    versions = library_versions("torch", "transformers", "heedful", "ferret-xai") + " (ferret-xai installed with --no-deps)"
    lines = machine_lines(
        model, args, texts, loads, versions,
        f", {model.hf_model.config._attn_implementation} attention",
    )
    return lines[:-1] + [
        f"- explanations: {', '.join(args.methods)} (integrated gradients with {args.ig_steps} steps, "
        "Gauss-Legendre, [PAD] baseline), predicted class, computed once and handed to both sides",
        lines[-1],
    ]


def render(found: dict[str, Any], info: list[str], args: argparse.Namespace) -> str:
    rows = found["rows"]
    n = rows[0]["n"]
    lines = [
        "# heedful vs ferret: AOPC comprehensiveness",
        "",
        f"## Same explanations, both evaluators ({n} sentences per method)",
        "",
        "heedful: `evaluate(model, explanations, [\"aopc\"], \"ferret\")`, every explanation of a "
        "method in one call. ferret: `AOPC_Comprehensiveness_Evaluation.compute_evaluation` per "
        "explanation, default arguments (what `Benchmark.evaluate_explanation` calls).",
        "",
        "| method | mean AOPC heedful | mean AOPC ferret | max abs diff (per example) | no positive score | heedful | ferret | ratio | positions heedful (real) | positions ferret (real) | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['mean_heedful']:.6f} | {r['mean_ferret']:.6f} | {r['max_diff']:.1e} | "
            f"{r['no_rationale']} | {fmt_s(r['heedful'])} | {fmt_s(r['ferret'])} | "
            f"{r['ferret'] / r['heedful']:.2f}x | {r['cells_heedful']:,} ({r['real_heedful']:,}) | "
            f"{r['cells_ferret']:,} ({r['real_ferret']:,}) | {r['cells_ferret'] / max(r['cells_heedful'], 1):.2f}x |"
        )
    total_h = sum(r["heedful"] for r in rows)
    total_f = sum(r["ferret"] for r in rows)
    cells_h = sum(r["cells_heedful"] for r in rows)
    cells_f = sum(r["cells_ferret"] for r in rows)
    real_h = sum(r["real_heedful"] for r in rows)
    real_f = sum(r["real_ferret"] for r in rows)
    lines += [
        f"| **all** | | | **{max(r['max_diff'] for r in rows):.1e}** | | {fmt_s(total_h)} | "
        f"{fmt_s(total_f)} | **{total_f / total_h:.2f}x** | {cells_h:,} ({real_h:,}) | {cells_f:,} ({real_f:,}) | "
        f"{cells_f / max(cells_h, 1):.2f}x |",
        "",
        f"All methods' explanations in one heedful call ({n * len(rows)} explanations, example-major): "
        f"{fmt_s(found['joint'])}, {found['joint_cells']:,} positions -- "
        f"**{total_f / found['joint']:.2f}x** ferret's total; largest difference from the per-method "
        f"calls {found['joint_diff']:.1e}.",
        "",
        "Positions: (rows x padded length) that went through the model, originals included; in "
        "brackets the real (unpadded) ones. Explaining (not timed above): "
        + ", ".join(f"{r['method']} {fmt_s(r['explain'])}" for r in rows)
        + ".",
        "",
        *precision_lines(found),
        "### Why the values agree",
        "",
        "heedful's `ferret` preset is ferret's protocol field by field: first and last tokens out "
        "of the ranking; only positive scores enter a rationale; `int(p * n)` tokens for `p` in "
        "`numpy.arange(0.1, 1.1, 0.1)` of the n content tokens, capped at the positive ones; a "
        "rationale equal to the previous one (or empty) skipped; rationale tokens deleted, the rest "
        "decoded with the tokenizer's `decode` and tokenised again (special tokens added anew, "
        "truncated to the model's length); softmax probability of the explained class; the mean of "
        "`p(x) - p(x \\ r)` over the remaining thresholds, 0 when none remains. The differences "
        "left are float32 rounding: the two sides batch and pad rows differently (heedful runs "
        "rows of similar length together; ferret runs each explanation's perturbed texts in "
        "batches of 8 padded to their longest and the original text alone). Ties between equal "
        "positive scores would be broken differently at a rationale's edge (ferret: "
        "`numpy.argsort`, heedful: earlier position first); explanations with tied positive "
        "scores here: "
        + ", ".join(f"{r['method']} {r['tied']}" for r in rows)
        + ".",
        "",
        "### Where the time goes",
        "",
        "Both sides are bound by the same forward passes: every distinct perturbed text has to run "
        "through the model once, and on a CPU a forward's cost grows with the token positions it "
        "runs; batching beyond a few hundred positions buys little more. heedful saves what can be saved without changing a number: "
        "each distinct text (pair) runs once, in chunks of similar length padded only to their "
        "own longest row, the originals of a whole call run together, and the last block runs "
        "only at `[CLS]`, the position the classifier reads (`heedful.adapters.anchored`). ferret "
        "runs one forward per original text and the perturbed texts of each explanation in "
        "batches of 8 padded to their longest, two or three small forwards per explanation.",
        "",
        f"Here heedful ran {cells_h:,} positions ({real_h:,} real), ferret {cells_f:,} "
        f"({real_f:,} real): per position heedful took {1e6 * total_h / max(cells_h, 1):.0f} us, "
        f"ferret {1e6 * total_f / max(cells_f, 1):.0f} us (small batches use the CPU less well). "
        f"heedful's padding adds {100 * (cells_h / max(real_h, 1) - 1):.0f} % to its real positions "
        "(a chunk is cut where one more forward would cost more than the padding it saves). "
        f"For {SPEED_TARGET:g}x ferret's time heedful has to "
        f"run them at {1e6 * total_f / SPEED_TARGET / max(real_h, 1):.0f} us each, "
        f"{(total_h / max(cells_h, 1)) / (total_f / SPEED_TARGET / max(real_h, 1)):.1f}x faster than "
        "its float32 passes ran here, hence the lower-precision passes above (the same positions, "
        f"cheaper): at bf16 heedful took {1e6 * sum(r['bf16'] for r in rows) / max(cells_h, 1):.0f} us "
        "per position, per method.",
        "",
    ]
    agree = max(r["max_diff"] for r in rows) <= AGREEMENT
    speed = total_f / sum(r["bf16"] for r in rows)
    joint_speed = total_f / found["joint_bf16"]
    delta = precision_deltas(found)["bf16"]
    lacking = precision_note("bf16")
    if lacking is None:
        speed_verdict = (
            f"**{'holds' if speed >= SPEED_TARGET else 'missed'}** per method ({speed:.2f}x), "
            f"**{'holds' if joint_speed >= SPEED_TARGET else 'missed'}** with all methods in one call ({joint_speed:.2f}x)"
        )
    else:  # the target assumes bfloat16 arithmetic
        speed_verdict = f"**skipped**: {lacking} (measured {speed:.2f}x per method, {joint_speed:.2f}x in one call)"
    lines += [
        "## Targets",
        "",
        f"- values agree with ferret at fp32 (per-example max abs diff <= {AGREEMENT:g}): "
        f"**{'holds' if agree else 'missed'}** ({max(r['max_diff'] for r in rows):.1e})",
        f"- heedful at bf16 >= {SPEED_TARGET:g}x faster than ferret: {speed_verdict}; "
        f"at fp32 {total_f / total_h:.2f}x and {total_f / found['joint']:.2f}x",
        f"- bf16 mean per-example |Delta AOPC| <= {DELTA_TARGET:g}: **{'holds' if delta['mean'] <= DELTA_TARGET else 'missed'}** "
        f"({delta['mean']:.5f}; max {delta['max']:.4f})",
        f"- method order of mean AOPC unchanged at bf16: **{'holds' if delta['same_order'] else 'missed'}**",
        "",
        "## Machine",
        "",
        *info,
        "",
    ]
    return "\n".join(lines)


def precision_deltas(found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per lower precision: max and mean per-example |AOPC - AOPC fp32| over every method's
    explanations (per-method calls), and whether the methods' order of mean AOPC is unchanged."""
    rows = found["rows"]
    fp32 = np.stack([r["values"] for r in rows], axis=1)
    out = {}
    for p in LOWER:
        low = np.stack([r[f"values_{p}"] for r in rows], axis=1)
        delta = np.abs(low - fp32)
        same = bool((np.argsort(-fp32.mean(axis=0), kind="stable") == np.argsort(-low.mean(axis=0), kind="stable")).all())
        out[p] = {"max": float(delta.max()), "mean": float(delta.mean()), "same_order": same, "means": low.mean(axis=0)}
    return out


def precision_lines(found: dict[str, Any]) -> list[str]:
    """The section comparing heedful at fp32, bf16 and int8 with ferret (same run)."""
    rows = found["rows"]
    total_f = sum(r["ferret"] for r in rows)
    deltas = precision_deltas(found)
    lines = [
        "## Lower precision: heedful fp32 vs bf16 vs int8 vs ferret (same run, same explanations)",
        "",
        "`evaluate(..., precision=\"bf16\" | \"int8\")`: the curves' forward passes (originals included) run on "
        "a low-precision copy of the model (bf16: a bfloat16 copy, logits returned in float32; int8: "
        "dynamically quantised linear layers); everything else as at fp32. Ratios are ferret's time over "
        "heedful's.",
        "",
        "| method | ferret | heedful fp32 | ratio | heedful bf16 | ratio | heedful int8 | ratio | mean AOPC fp32 / bf16 / int8 | max abs Delta bf16 | mean abs Delta bf16 | max abs Delta int8 | mean abs Delta int8 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d = {p: np.abs(r[f"values_{p}"] - r["values"]) for p in LOWER}
        lines.append(
            f"| {r['method']} | {fmt_s(r['ferret'])} | {fmt_s(r['heedful'])} | {r['ferret'] / r['heedful']:.2f}x | "
            f"{fmt_s(r['bf16'])} | **{r['ferret'] / r['bf16']:.2f}x** | {fmt_s(r['int8'])} | {r['ferret'] / r['int8']:.2f}x | "
            f"{r['values'].mean():.4f} / {r['values_bf16'].mean():.4f} / {r['values_int8'].mean():.4f} | "
            f"{d['bf16'].max():.4f} | {d['bf16'].mean():.5f} | {d['int8'].max():.4f} | {d['int8'].mean():.5f} |"
        )
    sums = {p: sum(r[p] for r in rows) for p in ("heedful", *LOWER)}
    lines += [
        f"| **all (per method)** | {fmt_s(total_f)} | {fmt_s(sums['heedful'])} | {total_f / sums['heedful']:.2f}x | "
        f"{fmt_s(sums['bf16'])} | **{total_f / sums['bf16']:.2f}x** | {fmt_s(sums['int8'])} | {total_f / sums['int8']:.2f}x | | "
        f"{deltas['bf16']['max']:.4f} | {deltas['bf16']['mean']:.5f} | {deltas['int8']['max']:.4f} | {deltas['int8']['mean']:.5f} |",
        f"| **all methods in one call** | {fmt_s(total_f)} | {fmt_s(found['joint'])} | {total_f / found['joint']:.2f}x | "
        f"{fmt_s(found['joint_bf16'])} | **{total_f / found['joint_bf16']:.2f}x** | {fmt_s(found['joint_int8'])} | "
        f"{total_f / found['joint_int8']:.2f}x | | | | | |",
        "",
        "Method order of mean AOPC against fp32: "
        + "; ".join(f"{p} {'unchanged' if deltas[p]['same_order'] else 'changed'}" for p in LOWER)
        + f". Positions run in one call: fp32 {found['joint_cells']:,}, bf16 {found['joint_cells_bf16']:,}, "
        f"int8 {found['joint_cells_int8']:,}.",
        "",
    ]
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-sentiment", help="zoo name or model directory")
    parser.add_argument("--n", type=int, default=200, help="number of held-out sentences")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["grad_x_input", "integrated_gradients", "normxlogit"],
        help="heedful methods whose explanations are evaluated",
    )
    parser.add_argument("--ig-steps", type=int, default=20, help="integrated gradients steps")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per measurement (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "ferret_aopc.md")
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny random BERT and corpus instead (script debugging)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console, model, texts, load_before = start(args)
    found = compare(model, texts, args, console)
    text = render(found, machine_info(model, args, texts, (load_before, os.getloadavg()[0])), args)
    return finish(text, args, console)


if __name__ == "__main__":
    raise SystemExit(main())
