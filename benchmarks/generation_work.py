"""The arithmetic each side of ``benchmarks/generation.py`` does: heedful's and Inseq's
generation attribution counted (``generation.Work``, a dispatch mode over PyTorch's flop formulas), method by method, on the same
generation -- the speed-up each target asks for, set against the one the two algorithms'
arithmetic allows at an equal rate of arithmetic.

A speed ratio of ``R`` between two sides that do ``W_heedful`` and ``W_peer`` floating-point
operations means heedful's operations run ``R * W_heedful / W_peer`` times as fast as the
peer's. The counts do not depend on the machine or its load (the times printed are not
comparable: counting slows both sides), so this script can run beside other work.

Counted: the matrix products -- every projection, the output head, eager attention's score and
value products (``mm``, ``addmm``, ``bmm``) and the fused attention kernel's
(:class:`generation.Work`). Not counted: elementwise work (norms, activations, softmax).

Integrated gradients does the same passes for every path point on both sides, so its work is
``a + b * n_steps``: counted at ``--ig-points`` (two values) and set out at ``--ig-steps``
(``benchmarks/generation.py``'s 50) from that line.

    python benchmarks/generation_work.py [--model smollm2-135m] [--n 16] [--steps 20] [--ig-steps 50]
                                         [--ig-points 2 4] [--threads 1] [--out benchmarks/results/generation-work.md]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from _shared import finish  # noqa: E402  (benchmarks/ is the script's folder)
from generation import (
    METHODS,
    TARGETS,
    differences,
    generated,
    generation_inputs,
    machine_section,
    measure,
)

ROOT = Path(__file__).resolve().parent.parent


def total(work: dict[str, int]) -> int:
    """All counted floating-point operations of one run."""
    return sum(work.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generation_inputs(parser)
    parser.add_argument("--ig-steps", type=int, default=50, help="the path points the work of integrated gradients is set out at")
    parser.add_argument("--ig-points", type=int, nargs=2, default=[2, 4], help="the two path counts integrated gradients is counted at")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "generation-work.md")
    args = parser.parse_args(argv)
    low_points, high_points = sorted(args.ig_points)
    if low_points == high_points or low_points < 1:
        print(f"error: --ig-points needs two different path counts of at least 1, got {args.ig_points}; try --ig-points 2 4", file=sys.stderr)
        return 2
    if args.ig_steps < 1:
        print(f"error: --ig-steps needs at least 1 path point, got {args.ig_steps}; try --ig-steps 50", file=sys.stderr)
        return 2
    console, load_before, lm, prompts, generation, _ = generated(args)
    continuations, prompt_lengths = generation.continuations, generation.prompt_lengths

    def counted(side: str, method: str, n_steps: int) -> dict:
        console.print(f"{method}: {side}" + (f" ({n_steps} path points)" if method == "integrated_gradients" else "") + " ...")
        kept = (generation.log_probs,) if side == "heedful" else (None,)
        return measure((side, method, args.model, prompts, continuations, n_steps, args.threads, "logit", *kept, True))

    rows = []
    for method in args.methods:
        points = (low_points, high_points) if method == "integrated_gradients" else (args.ig_steps,)
        found = {side: [counted(side, method, n) for n in points] for side in ("heedful", "inseq")}
        row = {"method": method, "points": points}
        for side, runs in found.items():
            works = [total(r["work"]) for r in runs]
            if len(points) == 2:  # a + b n through the two counts, set out at --ig-steps
                slope = (works[1] - works[0]) / (points[1] - points[0])
                row[side] = works[0] + slope * (args.ig_steps - points[0])
                row[f"{side}_per_point"] = slope
            else:
                row[side] = works[0]
            row[f"{side}_ops"] = runs[-1]["work"]
        worst, largest, compared = differences(found["heedful"][-1]["scores"], found["inseq"][-1]["scores"])
        row.update(ratio=row["inseq"] / row["heedful"], diff=worst, largest=largest, compared=compared)
        rows.append(row)

    text = _report(args, rows, lm, prompts, prompt_lengths, load_before)
    return finish(text, args, console)


def _ops(work: dict[str, int]) -> str:
    """The counted operations of a run, largest first, in GFLOP."""
    return ", ".join(f"`{op.split('.')[-2] if op.count('.') > 1 else op}` {n / 1e9:,.1f}" for op, n in sorted(work.items(), key=lambda kv: -kv[1]))


def _report(args, rows, lm, prompts, prompt_lengths, load_before) -> str:
    lines = [
        "# heedful generation attribution: the arithmetic of each side",
        "",
        f"{len(prompts)} prompts × {args.steps} generated tokens (greedy) on `{args.model}`, every generated token explained "
        "by heedful (`explain_generation`) and by Inseq 0.7 (`attribute`, forced decoding), as in "
        "`benchmarks/generation.py`; each side in a fresh process, its matrix products counted (`generation.Work`). GFLOP: floating-point "
        f"operations of the matrix products, elementwise work not counted (see the script's docstring); integrated gradients at {args.ig_steps} path points "
        f"from its counts at {args.ig_points[0]} and {args.ig_points[1]} (every point runs the same passes: `a + b × n`).",
        "",
        "| method | heedful GFLOP | Inseq GFLOP | Inseq / heedful | speed-up target | heedful's arithmetic rate the target needs (× Inseq's) | max abs diff | max abs score | prompts compared |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        target = TARGETS.get(r["method"])
        needed = f"{target / r['ratio']:.2f}×" if target else "—"
        lines.append(
            f"| {r['method']} | {r['heedful'] / 1e9:,.1f} | {r['inseq'] / 1e9:,.1f} | {r['ratio']:.2f}× | "
            f"{f'{target:g}×' if target else '—'} | {needed} | {r['diff']:.1e} | {r['largest']:.3g} | {r['compared']}/{len(prompts)} |"
        )
    lines += [
        "",
        "A target above the arithmetic ratio (a rate above 1× in the sixth column) is reached only if heedful's matrix products "
        "run that much faster per operation than Inseq's, both sides' being batched matrix products on the same processor.",
        "",
        "## What each side counts",
        "",
    ]
    for r in rows:
        per_point = ""
        if "heedful_per_point" in r:
            per_point = (
                f" Per path point: heedful {r['heedful_per_point'] / 1e9:,.1f}, Inseq {r['inseq_per_point'] / 1e9:,.1f} GFLOP "
                f"({r['inseq_per_point'] / r['heedful_per_point']:.2f}×)."
            )
        at = f" (at {r['points'][-1]} path points)" if "heedful_per_point" in r else ""
        lines.append(f"- {r['method']}{at}: heedful {_ops(r['heedful_ops'])}; Inseq {_ops(r['inseq_ops'])} GFLOP.{per_point}")
    lines += machine_section(args, lm, prompts, prompt_lengths, f"torch threads {args.threads}; load average {load_before:.2f} before, "
                             f"{os.getloadavg()[0]:.2f} after (counts do not depend on load)", ("torch", "transformers", "inseq"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
