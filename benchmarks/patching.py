"""A full layer x position activation-patching grid on smollm2-135m: heedful against nnsight, in
one process, on the same weights.

The grid restores the residual stream (each block's output) at every layer and position of the
clean prompt inside the run on a corrupted one -- a prompt pair of the same token length
(``--mode pair``, one row per cell) or ROME's noised subject (``--mode noise``, ``--samples``
rows per cell) -- and reads the target token's probability at the last position. Three ways:

* heedful: ``heedful.trace(..., atp=False)``, every cell a row of batched passes sized by the
  memory budget, continuing the clean prompt's key/value cache over the positions before the
  first corrupted token;
* nnsight, a trace per cell: ``with model.trace(corrupted): layers[l].output[:, p] = clean``,
  the loop of nnsight's activation-patching tutorial written plainly;
* nnsight, one trace with an invoke per cell (its ``LanguageModel`` batches the invokes into
  one pass of all rows; the plain ``NNsight`` wrapper refuses to batch invokes).

Each is timed (wall and process CPU time, interleaved rounds, the machine is shared) and its
peak resident memory above the process's before the run measured (VmHWM after
``heedful.engine.memory.reset_peak_rss``). The grids are checked equal.

Run (about 7 minutes on 2 shared cores)::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/patching.py --out benchmarks/results/patching.md
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the command line sets it: the cores are shared

import numpy as np
import torch
from _shared import emit, library_versions  # noqa: E402  (benchmarks/ is the script's folder)

import heedful
from heedful.engine.memory import current_rss, format_bytes, peak_rss, reset_peak_rss
from heedful.inside.tracing import prepare_runs

PROMPT = "The capital of France is"
PAIR = "The capital of Italy is"
SUBJECT = "France"
TARGET = " Paris"


def nnsight_grid(wrapped, runs, layers: int, batched: bool) -> np.ndarray:
    """The grid by nnsight (``wrapped``: an ``NNsight`` model, or with ``batched`` a
    ``LanguageModel``, which batches invokes): restored probability minus the corrupted one, ``[L, N]``."""
    target, anchor, width = runs.readout.target, int(runs.anchor[0]), runs.width
    clean_embeds, corrupted = runs.clean, runs.corrupted
    grid = np.zeros((layers, width))
    with torch.no_grad():
        clean = []
        with wrapped.trace(inputs_embeds=clean_embeds):
            for layer in range(layers):
                clean.append(wrapped.model.layers[layer].output.save())
        with wrapped.trace(inputs_embeds=corrupted):
            base = wrapped.output.logits[:, anchor].softmax(-1)[:, target].mean().save()
        if batched:
            found = []
            with wrapped.trace() as tracer:
                for layer in range(layers):
                    for pos in range(width):
                        with tracer.invoke(inputs_embeds=corrupted, attention_mask=torch.ones(corrupted.shape[:2], dtype=torch.long)):
                            wrapped.model.layers[layer].output[:, pos, :] = clean[layer][:, pos, :]
                            found.append(wrapped.output.logits[:, anchor].softmax(-1)[:, target].mean().save())
            return (np.array([float(f) for f in found]) - float(base)).reshape(layers, width)
        for layer in range(layers):
            for pos in range(width):
                with wrapped.trace(inputs_embeds=corrupted):
                    wrapped.model.layers[layer].output[:, pos, :] = clean[layer][:, pos, :]
                    score = wrapped.output.logits[:, anchor].softmax(-1)[:, target].mean().save()
                grid[layer, pos] = float(score) - float(base)
    return grid


def timed(fn):
    """``(result, wall seconds, CPU seconds, peak bytes above the resident set before)``."""
    reset_peak_rss()
    before = current_rss()
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return result, wall, cpu, max(0, peak_rss() - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("pair", "noise"), default="pair")
    parser.add_argument("--samples", type=int, default=10, help="noise samples per cell (--mode noise)")
    parser.add_argument("--repeats", type=int, default=1, help="timed rounds (interleaved)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    import warnings

    from nnsight import LanguageModel, NNsight

    model = heedful.load("smollm2-135m")
    wrapped = NNsight(model.hf_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LanguageModel's deprecation: its successor loads by repository id only
        language_model = LanguageModel(model.hf_model, tokenizer=model.tokenizer)
    layers = model.hf_model.config.num_hidden_layers
    options = {"corrupt": SUBJECT, "samples": args.samples} if args.mode == "noise" else {"counterfactual": PAIR}
    runs = prepare_runs(
        model.adapter, PROMPT, target=TARGET, contrast=None, metric="prob", noise=3.0, seed=0,
        **{"corrupt": None, "counterfactual": None, "samples": 1, **options},
    )[0]
    sides = {
        "heedful (batched rows)": lambda: heedful.trace(model, PROMPT, target=TARGET, atp=False, **options).effect,
        "nnsight, a trace per cell": lambda: nnsight_grid(wrapped, runs, layers, batched=False),
        "nnsight, one trace of invokes": lambda: nnsight_grid(language_model, runs, layers, batched=True),
    }
    results: dict[str, list[tuple]] = {name: [] for name in sides}
    load_before = os.getloadavg()[0]
    for round_ in range(args.repeats + 1):  # round 0 warms up
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            found = timed(sides[name])
            print(f"round {round_} {name}: {found[1]:.2f} s wall, {found[2]:.2f} s CPU, peak +{format_bytes(found[3])}", flush=True)
            if round_:
                results[name].append(found)
    load_after = os.getloadavg()[0]
    reference = results["heedful (batched rows)"][-1][0]
    first = (runs.corrupted[0] != runs.clean[0]).any(dim=-1).nonzero().min().item()
    ran = layers * (runs.width - first)
    cells = layers * runs.width
    rows = cells * runs.samples
    ours = np.median([r[1] for r in results["heedful (batched rows)"]])
    lines = [
        "# Activation patching: heedful against nnsight",
        "",
        f"A full layer x position grid of residual-stream restorations on smollm2-135m ({layers} layers x {runs.width} positions = {cells} cells, "
        f"{rows} corrupted rows): {PROMPT!r} "
        + (f"against {PAIR!r}" if args.mode == "pair" else f"with {SUBJECT!r} noised (3 sd, {args.samples} samples per cell)")
        + f", the probability of {TARGET!r} at the last position. Median of {args.repeats} timed rounds after a warm-up, sides interleaved.",
        "",
        "| side | wall (median) | CPU (median) | heedful faster by | peak memory above start | max abs difference from heedful's grid |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, found in results.items():
        wall = np.median([r[1] for r in found])
        cpu = np.median([r[2] for r in found])
        peak = max(r[3] for r in found)
        diff = float(np.abs(found[-1][0] - reference).max())
        lines.append(f"| {name} | {wall:.2f} s | {cpu:.2f} s | {wall / ours:.1f}x | {format_bytes(peak)} | {diff:.1e} |")
    notes = [
        f"- load average {load_before:.2f} before, {load_after:.2f} after (the machine is shared)",
        f"- {library_versions('torch', 'transformers', 'nnsight')}; {torch.get_num_threads()} torch threads",
        f"- heedful's passes: the rows of the cells in chunks sized by the memory budget ({format_bytes(model.adapter.max_memory)}), "
        "the head read at the last position only; the cells of positions before the first corrupted token (equal in both runs of a causal model, "
        f"so their effect is 0) run no pass: {ran} of {cells} cells ran, each continuing the clean prompt's key/value cache over those {first} positions "
        f"and computing the other {runs.width - first}. nnsight runs every cell through the model as built (logits at every position).",
    ]
    emit(lines, notes, args.out)


if __name__ == "__main__":
    main()
