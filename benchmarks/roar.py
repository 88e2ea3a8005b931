"""ROAR and KAR (Hooker et al. 2019) on ``minilm-sentiment``: the accuracy of a classifier retrained
without each method's top-k % tokens.

For every method and fraction k this script (through :func:`heedful.evaluate.roar.roar`)

1. explains ``--train-n`` movie snippets drawn (seed 0) from the train split and ``--test-n``
   drawn from the test split with the method (minilm-sentiment, its predicted class);
2. replaces the top ``round(k n)`` of each snippet's ``n`` content tokens by ``[MASK]``
   (``--operator``), in train and test alike (``--modes kar``: all but them);
3. trains a fresh minilm-sentiment -- the MiniLM encoder with a head drawn with the seed -- on
   the degraded train snippets exactly as the zoo builds it (two epochs, AdamW 1e-4, batches of
   32; :func:`heedful.zoo.retraining.retrainer`), and measures its accuracy on the degraded test
   snippets, with the 95 % bootstrap interval over test snippets and the paired difference
   against the random ranking at the same k;
4. writes the tables, the plot (accuracy against k) and the cost to ``--out``.

Explanations and every retrain's outcome are kept in ``--store`` (default
``<heedful home>/roar``) as they are computed: Ctrl-C keeps them and the same command computes
only what is missing, so the grid can be grown a few retrains at a time. The store behind
``docs/results/roar.md`` is archived in ``benchmarks/store/roar``: after ``heedful bench load
benchmarks/store/roar <heedful home>/roar`` the file's command retrains nothing. The cost is stated in
the file: the wall time of every retrain (all of it is training and one pass over the test set)
and of explaining, per method.

    python benchmarks/roar.py [--methods random,saliency,solvability_beam[beam=1,prior=attnlrp],...] [--fractions 0.1,0.3,0.5,0.7,0.9]
        [--seeds 0] [--modes roar[,kar]] [--train-n 2400] [--test-n 1000] [--operator mask]
        [--epochs 2] [--threads 2] [--store DIR] [--out docs/results/roar.md]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _shared import command_line, library_versions, run_line, write_results  # noqa: E402  (benchmarks/ is the script's folder)
from frontier_store import labels, split_label

import heedful
from heedful.errors import HeedfulError, Interrupted
from heedful.evaluate.intervals import bootstrap_paired_difference
from heedful.evaluate.roar import (
    BASELINE,
    DEFAULT_FRACTIONS,
    DEFAULT_METHODS,
    REFERENCE,
    TRAIN_EXAMPLES,
    RoarResult,
    roar,
)
from heedful.files.cache import heedful_home
from heedful.zoo.retraining import retrainer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "minilm-sentiment"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help="comma-separated methods, each optionally with options: saliency,solvability_beam[beam=1,prior=attnlrp] "
                             "(random always runs; one row per method)")
    parser.add_argument("--fractions", default=",".join(f"{k:g}" for k in DEFAULT_FRACTIONS), help="comma-separated k in (0, 1)")
    parser.add_argument("--seeds", default="0", help="comma-separated retraining seeds")
    parser.add_argument("--modes", default="roar", help="roar, kar or roar,kar")
    parser.add_argument("--train-n", type=int, default=TRAIN_EXAMPLES, help=f"train snippets drawn from the train split (default {TRAIN_EXAMPLES})")
    parser.add_argument("--test-n", type=int, default=None, help="test snippets drawn (seed 0) from the test split (default: all 1,000)")
    parser.add_argument("--operator", default="mask", help="what replaces a removed token: mask, unk, pad, delete or sample")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default: the zoo build's, 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (training's enters the store keys: it decides the weights)")
    parser.add_argument("--store", type=Path, default=None, help="where explanations and retrains are kept (default <heedful home>/roar)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "roar.md")
    return parser.parse_args()


def cell(mean: float, low: float, high: float, signed: bool = False) -> str:
    form = "{:+.3f}" if signed else "{:.3f}"
    return f"{form.format(mean)} [{form.format(low)}, {form.format(high)}]"


def tables(result: RoarResult, modes: list[str]) -> list[str]:
    """Per mode: a row per method and seed, a column per k (accuracy, then the paired difference
    against random, bold where its interval excludes zero in the better direction)."""
    frame = result.table
    lines: list[str] = []
    reference = frame[frame["method"] == REFERENCE]
    for mode in modes:
        part = frame[(frame["mode"] == mode) & (frame["method"] != REFERENCE)]
        ks = sorted(part["k"].unique())
        better = "falls further" if mode == "roar" else "stays higher"
        lines += [f"## {mode.upper()}: {'the top k removed' if mode == 'roar' else 'only the top k kept'}", "",
                  f"Accuracy on the degraded test snippets; below it, the paired difference against `{BASELINE}` at the same k "
                  f"(**bold**: the method's accuracy {better} than random's, interval apart from zero).", ""]
        lines += ["| method | seed | " + " | ".join(f"k = {k:g}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
        for (method, seed), rows in part.groupby(["method", "seed"], sort=False):
            cells = []
            for k in ks:
                row = rows[rows["k"] == k].iloc[0]
                text = cell(row["accuracy"], row["low"], row["high"])
                if method != BASELINE:
                    diff = cell(row["vs_random"], row["vs_random_low"], row["vs_random_high"], signed=True)
                    wins = row["vs_random_high"] < 0 if mode == "roar" else row["vs_random_low"] > 0
                    text += f"<br>{'**' + diff + '**' if wins else diff}"
                cells.append(text)
            lines.append(f"| `{method}` | {seed} | " + " | ".join(cells) + " |")
        lines.append("")
    for _, row in reference.iterrows():
        lines.append(f"Retrained on the unmodified snippets (k = 0), seed {row['seed']}: accuracy {cell(row['accuracy'], row['low'], row['high'])}.")
    return lines + [""]


def apart(result: RoarResult, modes: list[str]) -> list[str]:
    """Per mode, k and seed: the method whose ranking moved the retrained accuracy furthest (lowest
    under ROAR, highest under KAR) and every other method's paired difference from it (95 %
    bootstrap over the same test snippets), saying which intervals exclude zero and which overlap."""
    frame = result.table
    lines = ["## Which rankings are apart", "",
             "Paired differences from the method that moved the retrained accuracy furthest at each k (95 % paired "
             "bootstrap over the same test snippets): *apart* where the interval excludes zero, *overlap* where it does not.", ""]
    for mode in modes:
        part = frame[(frame["mode"] == mode) & (~frame["method"].isin([REFERENCE, BASELINE]))]
        for (k, seed), rows in part.groupby(["k", "seed"], sort=True):
            if len(rows) < 2:
                continue
            lead = rows.loc[rows["accuracy"].idxmin() if mode == "roar" else rows["accuracy"].idxmax()]
            best = result.correct[(mode, lead["method"], k, seed)]
            cells = []
            for _, row in rows[rows["method"] != lead["method"]].iterrows():
                diff, low, high = bootstrap_paired_difference(result.correct[(mode, row["method"], k, seed)], best)
                cells.append(f"`{row['method']}` {cell(diff, low, high, signed=True)} ({'apart' if low > 0 or high < 0 else 'overlap'})")
            lines.append(f"- {mode.upper()} k = {k:g}, seed {seed}: `{lead['method']}` {lead['accuracy']:.3f}; " + "; ".join(cells))
    return lines + [""]


def plot(path: Path, result: RoarResult, mode: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = result.table
    part = frame[(frame["mode"] == mode) & (frame["method"] != REFERENCE)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, rows in part.groupby("method", sort=False):
        means = rows.groupby("k")[["accuracy", "low", "high"]].mean()
        style = {"color": "black", "ls": "--"} if method == BASELINE else {}
        ax.errorbar(means.index, means["accuracy"], yerr=[means["accuracy"] - means["low"], means["high"] - means["accuracy"]],
                    marker="o", ms=3, capsize=2, label=method, **style)
    for _, row in frame[frame["method"] == REFERENCE].iterrows():
        ax.axhline(row["accuracy"], color="gray", lw=0.8, ls=":")
    ax.set_xlabel("k: share of each snippet's content tokens " + ("removed" if mode == "roar" else "kept"))
    ax.set_ylabel("accuracy of the retrained model (95 % bootstrap)")
    ax.set_title(f"{mode.upper()} on {MODEL}: {result.n_train} train / {result.n_test} test snippets", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cost(result: RoarResult, args: argparse.Namespace) -> list[str]:
    frame = result.table
    per = float(np.nanmean(frame["retrain_seconds"]))
    training = float(np.nanmean(frame["train_seconds"]))
    steps = int(np.nanmedian(frame["steps"]))
    explain = ", ".join(f"`{m}` {s * 1000:.0f} ms" for m, s in result.explain_seconds.items() if np.isfinite(s))
    full = len(DEFAULT_METHODS) * len(DEFAULT_FRACTIONS) + 1
    zoo = retrainer(MODEL).settings  # the zoo build's epochs and batches
    default_steps = zoo["epochs"] * math.ceil(TRAIN_EXAMPLES / zoo["batch_size"])
    return [
        "## Cost",
        "",
        f"- one retrain: **{per / 60:.1f} min** on average (max {np.nanmax(frame['retrain_seconds']) / 60:.1f}): a fresh model, "
        f"{training / 60:.1f} min of training ({steps} optimiser steps over {result.n_train} snippets, {training / steps:.1f} s a step) and "
        f"one pass over {result.n_test} test snippets, on {args.threads} torch threads",
        f"- this grid: {len(frame)} retrains ({result.retrained} computed by this run, the rest read from the store) (methods x fractions x seeds x modes, and a reference "
        f"per seed) -- {len(frame) * per / 3600:.1f} h of retraining",
        f"- explaining, wall time per snippet (train and test): {explain}",
        f"- at this speed the default grid ({full} retrains: {len(DEFAULT_METHODS)} methods x {len(DEFAULT_FRACTIONS)} fractions and the "
        f"reference, one seed, {TRAIN_EXAMPLES} snippets, {default_steps} steps each) would take about "
        f"{full * (default_steps * training / steps + per - training) / 3600:.1f} h of retraining",
        "",
    ]


def main() -> int:
    args = arguments()
    torch.set_num_threads(args.threads)
    asked = labels(args.methods)
    try:
        rows = [split_label(label) for label in asked]
    except HeedfulError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    methods = [name for name, _ in rows]
    if len(set(methods)) < len(methods):
        print(f"error: --methods names a method twice ({args.methods}); ROAR keeps one row per method: drop one", file=sys.stderr)
        return 2
    options = {name: chosen for name, chosen in rows if chosen}
    fractions = [float(k) for k in args.fractions.split(",") if k]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    changes = {"threads": args.threads, **({"epochs": args.epochs} if args.epochs else {})}
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    model = heedful.load(MODEL)
    try:
        result = roar(
            model, retrainer(MODEL, **changes), args.store or heedful_home() / "roar", "movies", methods, fractions,
            operator=args.operator, seeds=seeds, modes=modes, train_n=args.train_n, test_n=args.test_n, method_options=options,
        )
    except Interrupted as exc:  # what the store kept; the same command resumes
        print(exc.message, file=sys.stderr)
        return 130
    except HeedfulError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    minutes = (time.perf_counter() - start) / 60
    shown = {name: label for label, (name, chosen) in zip(asked, rows, strict=True) if chosen}  # rows with options by their label
    result.table["method"] = result.table["method"].replace(shown)
    result.explain_seconds = {shown.get(m, m): s for m, s in result.explain_seconds.items()}
    result.correct = {(mode, shown.get(m, m), k, seed): v for (mode, m, k, seed), v in result.correct.items()}
    sections = []
    for mode in modes:
        png = args.out.with_name(f"{args.out.stem}-{mode}-{MODEL}.png")
        png.parent.mkdir(parents=True, exist_ok=True)
        plot(png, result, mode)
        sections += [f"![{mode.upper()} accuracy against k]({png.name})", ""]
    settings = retrainer(MODEL, **changes).settings
    head = [
        f"# ROAR{' and KAR' if 'kar' in modes else ''} on {MODEL}",
        "",
        f"Generated by `benchmarks/roar.py` (Hooker et al. 2019, RemOve And Retrain; `heedful/evaluate/roar.py`). "
        f"{result.n_train} movie snippets drawn (seed 0) from the train split and {result.n_test} test snippets, each explained by "
        f"every method for {MODEL}'s predicted class; the top round(k n) of each snippet's n content tokens replaced by "
        f"`{args.operator}` in both (KAR: all the others); a fresh {MODEL} (the MiniLM encoder, a 2-way head drawn with the seed) "
        f"trained on the degraded train snippets as the zoo builds it ({settings['epochs']} epochs, AdamW {settings['learning_rate']:g}, "
        f"batches of {settings['batch_size']}, {settings['max_length']} tokens) and scored on the degraded test snippets. "
        "Intervals: 95 % percentile bootstrap over test snippets; differences: paired bootstrap against the random ranking "
        "at the same k and seed. The class may leak through which positions are masked (Rong et al. 2022); the random "
        "ranking cannot leak it.",
        "",
    ]
    tail = [
        command_line(),
        run_line(minutes, load_before, args.threads),
        f"- {library_versions('torch', 'transformers')}",
    ]
    body = sections + tables(result, modes) + apart(result, modes) + cost(result, args)
    write_results(args.out, "\n".join(head + body + tail) + "\n")
    print("\n".join(line for line in body if line.startswith("|") or line.startswith("- ") or line.startswith("Retrained")))
    print(f"written to {args.out} in {minutes:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
