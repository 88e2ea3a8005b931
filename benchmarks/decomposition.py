"""Cost of the decomposition family -- DecompX, ALTI, GlobEnc, Value Zeroing -- against one
forward pass, and against the reference formulas run as plain per-layer loops.

For the first ``--n`` sentences of the movies test split and ``--model`` (default the zoo's
``minilm-sentiment``, a BERT-style encoder) this script

1. times one plain batched forward pass of all sentences (no grad, the ``transformers`` model
   alone) -- the unit;
2. times each method through ``model.explain(texts, method, batch_size=n)`` (the whole call:
   tokenizing, the prediction's pass, the method), interleaved with the forward pass, and gives
   the ratio; measures each one's peak resident memory increase in a run of its own;
3. runs the reference formulas as plain per-layer loops on the first ``--reference-n``
   sentences, one sentence at a time, and compares time and scores with heedful on the same
   sentences: DecompX as its reference computes BERT (the tests' oracle: one ``[N, N, D]``
   state per layer, absdot biases, GELU and tanh slopes, pooler and classifier), Value Zeroing
   as its reference runs (``L x N`` single-block passes: block ``l`` on its original input with
   token ``j``'s values zeroed, cosine distance, rows normalised, rollout);
4. counts the multiply-adds each method needs at these lengths against a forward pass's, so the
   targets can be read against what any exact implementation must compute: DecompX pushes ``N``
   parts of ``D`` values through every projection of every block (``~N x`` a forward's
   products); Value Zeroing must run every block's MLP -- a non-linear map -- on each of the
   ``N x N`` different inputs that zeroing one token's values gives the positions (heedful runs
   exactly that, the attention output corrected rather than recomputed).

Targets (from the issue): DecompX <= 4x a forward pass at 64 sentences; Value Zeroing <= (1 +
layers) forward passes' time.

    python benchmarks/decomposition.py [--model minilm-sentiment] [--n 64] [--reference-n 8]
        [--repeats 3] [--threads 2] [--out benchmarks/results/decomposition.md] [--tiny]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _shared import ROOT, finish, fmt_s, library_versions, machine_lines, measure, start  # noqa: E402  (benchmarks/ is the script's folder)

import heedful
from heedful.attribution.contributions import row_normalised
from heedful.engine.memory import current_rss, peak_rss, reset_peak_rss

HERE = Path(__file__).resolve().parent
METHODS = ("decompx", "alti", "globenc", "value_zeroing")
DECOMPX_TARGET = 4.0


# ---------------------------------------------------------------------------- the references
def decompx_reference(model: heedful.Model, text: str, column: int) -> np.ndarray:
    """DecompX as its reference computes it for BERT, one sentence and one layer at a time (the
    tests' independent oracle, ``tests/test_decomposition_methods.py``)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_decomposition_methods import decompx_oracle_bert  # type: ignore[import-not-found]

    return decompx_oracle_bert(model, text, column)


def value_zeroing_reference(model: heedful.Model, text: str) -> np.ndarray:
    """Value Zeroing as its reference runs it on a BERT encoder: for every layer ``l`` and token
    ``j`` one pass of block ``l`` alone on its original input with ``j``'s value vectors zeroed;
    ``S^l[i, j]`` the cosine distance of the outputs, rows normalised, rolled out ``S^L ...
    S^1``; the first token's row."""
    hf = model.hf_model
    enc = model.tokenizer(text, return_tensors="pt")
    blocks = hf.base_model.encoder.layer
    with torch.no_grad():
        hidden = hf(**enc, output_hidden_states=True).hidden_states
        n = hidden[0].shape[1]
        joint = None
        for layer, block in enumerate(blocks):
            token = [0]

            def zero(module, args, out, token=token):
                out = out.clone()
                out[:, token[0]] = 0
                return out

            hook = block.attention.self.value.register_forward_hook(zero)
            original = hidden[layer + 1][0].double()
            matrix = torch.zeros(n, n, dtype=torch.float64)
            for j in range(n):
                token[0] = j
                out = block(hidden[layer])
                zeroed = (out[0] if isinstance(out, tuple) else out)[0].double()
                matrix[:, j] = (1 - torch.nn.functional.cosine_similarity(zeroed, original, dim=-1)).clamp_min(0)
            hook.remove()
            matrix = row_normalised(matrix)
            joint = matrix if joint is None else matrix @ joint
    return joint[0].numpy()


# ---------------------------------------------------------------------------- counting
def multiply_adds(model: heedful.Model, lengths: list[int], width: int) -> dict[str, float]:
    """Multiply-adds per method relative to one forward pass over ``len(lengths)`` sentences
    padded to ``width``: the forward pass's projections (``4 D^2 + 2 D F`` per token and block,
    a gated MLP ``3 D F``) and attention (``2 N D``); DecompX the same projections for each of a
    position's ``N`` parts but the queries and keys (``2 D^2 + 2 D F`` per part) plus mixing
    them (``N D`` per part); Value Zeroing the MLP of every block on each of ``N x N`` inputs
    (position ``i`` with token ``j``'s values zeroed), plus the prediction's and the recording
    pass of each sentence."""
    shape = model.adapter.shape
    d, f, blocks = shape.hidden, shape.intermediate, shape.layers
    mlp = (3 if any(b.mlp_gate is not None for b in model.adapter.roles().blocks) else 2) * d * f
    forward = len(lengths) * width * blocks * (4 * d * d + mlp + 2 * width * d)
    decompx = sum(n * n * blocks * (2 * d * d + mlp + n * d) for n in lengths)
    sentence = [n * blocks * (4 * d * d + mlp + 2 * n * d) for n in lengths]
    zeroing = sum(n * n * blocks * mlp for n in lengths) + 2 * sum(sentence)
    return {"decompx": decompx / forward, "value_zeroing": zeroing / forward}


# ---------------------------------------------------------------------------- the run
def peak_of(fn) -> float:
    """Peak resident-memory increase (MB) of one call of ``fn``."""
    reset_peak_rss()
    base = current_rss()
    fn()
    return (peak_rss() - base) / 2**20


def reference_rows(model: heedful.Model, texts: list[str]) -> list[tuple[str, float, float, float, float]]:
    """``(method, reference s / sentence, heedful s / sentence, ratio, max relative difference)``
    on ``texts``, one sentence at a time on both sides."""
    predicted = [model.explain(t, "logat").target.indices[0] for t in texts]
    rows = []
    sides = {
        "decompx": (lambda t, c: decompx_reference(model, t, c), lambda t, c: model.explain(t, "decompx", target=c).scores),
        "value_zeroing": (lambda t, c: value_zeroing_reference(model, t), lambda t, c: model.explain(t, "value_zeroing").scores),
    }
    for method, (reference, ours) in sides.items():
        ours(texts[0], predicted[0])  # warm-up
        reference(texts[0], predicted[0])
        times = {"reference": 0.0, "heedful": 0.0}
        diff = 0.0
        for text, column in zip(texts, predicted, strict=True):
            began = time.perf_counter()
            expected = np.asarray(reference(text, column), dtype=np.float64)
            times["reference"] += time.perf_counter() - began
            began = time.perf_counter()
            found = np.asarray(ours(text, column), dtype=np.float64)
            times["heedful"] += time.perf_counter() - began
            diff = max(diff, float(np.abs(found - expected).max() / max(np.abs(expected).max(), 1e-12)))
        per = {k: v / len(texts) for k, v in times.items()}
        rows.append((method, per["reference"], per["heedful"], per["reference"] / per["heedful"], diff))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console, model, texts, load_before = start(args)
    batch = model.encode(texts)
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    if batch.token_type_ids is not None:
        inputs["token_type_ids"] = batch.token_type_ids
    hf = model.hf_model

    def forward():
        with torch.no_grad():
            return hf(**inputs)

    fns = {"forward": forward} | {m: (lambda m=m: model.explain(texts, m, batch_size=len(texts))) for m in METHODS}
    console.print(f"[dim]timing {', '.join(fns)} on {len(texts)} sentences ...[/dim]")
    timed = measure(fns, args.repeats)
    unit = timed["forward"].median
    peaks = {name: peak_of(fn) for name, fn in fns.items()}
    lengths = [int(n) for n in batch.lengths.tolist()]
    counted = multiply_adds(model, lengths, batch.seq_len)
    layers = model.adapter.num_layers
    console.print(f"[dim]reference loops on {args.reference_n} sentences ...[/dim]")
    references = [] if args.tiny else reference_rows(model, texts[: args.reference_n])

    lines = [
        "# The decomposition family: cost",
        "",
        f"Unit: one plain batched forward pass of the {len(texts)} sentences (no grad) = **{fmt_s(unit)}** "
        f"(median of {len(timed['forward'].times)} runs).",
        "",
        "| method | heedful | × forward | (CPU) | peak memory | multiply-adds × forward | target |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| forward | {fmt_s(unit)} | 1.00× | 1.00× | {peaks['forward']:.0f} MB | 1.0× | |",
    ]
    targets = {"decompx": DECOMPX_TARGET, "value_zeroing": 1.0 + layers}
    verdicts = []
    for method in METHODS:
        t = timed[method]
        ratio = t.median / unit
        cpu = t.cpu_median / timed["forward"].cpu_median
        target = targets.get(method)
        count = counted.get(method)
        cells = [
            method, fmt_s(t.median), f"{ratio:.2f}×", f"{cpu:.2f}×", f"{peaks[method]:.0f} MB",
            f"{count:.1f}×" if count is not None else "—",
            (f"≤ {target:.0f}× — {'met' if ratio <= target else 'not met'}" if target is not None else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if target is not None:
            verdicts.append(
                f"- **{method}**: {ratio:.2f}× a forward pass against a target of ≤ {target:.0f}× — "
                f"**{'met' if ratio <= target else 'not met'}**. Its multiply-adds at these lengths are {count:.1f}× a "
                f"forward pass's"
                + (", so no exact implementation reaches the target here; heedful's batched run takes "
                   f"{ratio / count:.2f}× the time its multiply-adds would take at the forward pass's rate."
                   if count > target else ".")
            )
    mean_len = float(np.mean(lengths))
    lines += [
        "",
        f"Sentences of {mean_len:.1f} tokens on average (padded batch width {batch.seq_len}); {layers} layers. "
        "Multiply-adds: see the script's docstring (`multiply_adds`); they are a floor for an exact computation, "
        "since DecompX must push every token's part through every projection and Value Zeroing must run every "
        "block's MLP on each of the N x N inputs that zeroing one token's values gives.",
        "",
        *verdicts,
        "",
    ]
    if references:
        lines += [
            f"## Against the reference formulas as plain per-layer loops ({args.reference_n} sentences, one at a time)",
            "",
            "| method | reference loop, s / sentence | heedful, s / sentence | reference / heedful | max relative difference |",
            "|---|---:|---:|---:|---:|",
        ]
        for method, ref, ours, ratio, diff in references:
            lines.append(f"| {method} | {fmt_s(ref)} | {fmt_s(ours)} | {ratio:.2f}× | {diff:.1e} |")
        lines += [
            "",
            "DecompX's loop keeps the reference's `[N, N, D]` state per layer for one sentence (the tests' oracle); "
            "Value Zeroing's runs the reference's `L × N` single-block passes. heedful explains one sentence per call "
            "here too, so the ratio is the algorithm's, not batching's.",
            "",
        ]
    versions = library_versions("torch", "transformers")
    lines += ["## Machine", "", *machine_lines(model, args, texts, (load_before, os.getloadavg()[0]), versions), ""]
    return finish("\n".join(lines), args, console)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-sentiment", help="zoo name or model directory")
    parser.add_argument("--n", type=int, default=64, help="sentences (one batch)")
    parser.add_argument("--reference-n", type=int, default=8, help="sentences for the plain reference loops")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny BERT (a smoke run; no reference loops)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "decomposition.md")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
