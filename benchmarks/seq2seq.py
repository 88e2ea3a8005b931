"""Encoder–decoder attribution: heedful against Inseq, same model, same outputs, same targets.

1. heedful translates (greedy, ``--steps`` new tokens at most) each of ``--n`` source sentences;
   those outputs, forced, are what both sides explain.
2. For each method, heedful (``model.explain_generation`` with ``continuation=``) and Inseq
   (``attribute(sources, outputs, attribute_target=True)``) explain every output token over
   the source and the target prefix, each side in a fresh process: the time of the attribution
   call and its peak resident memory above the loaded model are recorded.
3. The scores are compared where the definitions match (``tests/test_seq2seq_inseq.py``):
   saliency (L2 norm of Inseq's ``|grad|``), input x gradient and integrated gradients (sums of
   Inseq's per-dimension attributions; ``n_steps`` and Gauss-Legendre alike, baseline the
   unknown token), attention (last layer, mean over heads); both explain each step's logit.
   A Marian model with ``scale_embedding`` is explained by Inseq 0.7.1 with its decoder's
   embeddings scaled twice (see that test), so its scores are compared only on source and
   target tokens of the first step and reported as such.

No encoder–decoder with trained weights ships on PyPI, and no hub is reachable here, so
``--model`` defaults to a seeded Marian of opus-mt's shape (6 + 6 layers of width 512, random
weights, the tiny tokenizer's 153-token vocabulary: :func:`heedful.tiny_seq2seq.build_tiny_marian`
with ``OPUS_MT_SHAPE``; ``--shape tiny`` for the 2 + 2-layer test model) -- its times are those of
an opus-mt model but for the output projection (58,101 columns there); give a folder or hub id
(``Helsinki-NLP/opus-mt-en-de``, ``t5-small``) where one can be had.

    python benchmarks/seq2seq.py [--model FOLDER_OR_HUB_ID | --shape opus-mt|tiny] [--n 8] [--steps 20] [--ig-steps 50]
                                 [--threads 2] [--out benchmarks/results/seq2seq.md]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _shared import command_line, cpu_name, fmt_s, library_versions, write_results  # noqa: E402  (benchmarks/ is the script's folder)

SOURCES = [
    "The house is wonderful.",
    "The film is boring.",
    "What a waste.",
    "the plot is predictable yet the actors are wonderful",
    "we watched it twice and loved every minute",
    "the capital of france is paris",
    "a charming and often affecting journey",
    "this mall is closed but these malls are open",
]
METHODS = {
    # name: (heedful method, heedful options, inseq method, inseq options, reduction of inseq's raw tensor)
    "saliency": ("saliency", {}, "saliency", {}, "norm"),
    "input x gradient": ("grad_x_input", {"aggregate": "sum"}, "input_x_gradient", {}, "sum"),
    "integrated gradients": ("integrated_gradients", {"aggregate": "sum", "baseline": "unk"}, "integrated_gradients", {}, "sum"),
    "attention": ("raw_attention", {}, "attention", {}, "attention"),
}


def _rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _load(model: str, threads: int):
    import heedful

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    return heedful.load(model)


def run_heedful(model: str, threads: int, sources: list[str], outputs: list[str], method: str, options: dict) -> tuple[float, int, list]:
    m = _load(model, threads)
    m.explain_generation(sources[:1], method, continuation=outputs[:1], quantity="logit", **options)  # warm-up
    before = _rss_now()
    began = time.perf_counter()
    found = m.explain_generation(sources, method, continuation=outputs, quantity="logit", **options)
    seconds = time.perf_counter() - began
    return seconds, max(0, _rss_peak() - before), [(g.source_length, g.scores) for g in found]


def run_inseq(model: str, threads: int, sources: list[str], outputs: list[str], method: str, options: dict, reduce: str) -> tuple[float, int, list]:
    import inseq

    m = _load(model, threads)
    wrapped = inseq.load_model(m.hf_model, method, tokenizer=m.tokenizer)
    extra = {} if method == "attention" else {"attributed_fn": "logit"}
    wrapped.attribute(sources[:1], outputs[:1], attribute_target=True, show_progress=False, **extra, **options)
    before = _rss_now()
    began = time.perf_counter()
    out = wrapped.attribute(sources, outputs, attribute_target=True, show_progress=False, **extra, **options)
    seconds = time.perf_counter() - began
    found = []
    for attr in out.sequence_attributions:
        parts = []
        for tensor in (attr.source_attributions, attr.target_attributions):
            if reduce == "norm":
                parts.append(tensor.norm(dim=-1).T.double().numpy())
            elif reduce == "sum":
                parts.append(tensor.sum(dim=-1).T.double().numpy())
            else:
                parts.append(tensor[..., -1, :].mean(dim=-1).T.double().numpy())
        found.append(parts)
    return seconds, max(0, _rss_peak() - before), found


def _fresh(fn, *args):
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _difference(ours: list, theirs: list, first_step_only: bool) -> float:
    """The largest difference relative to the largest score, over every compared cell
    (``first_step_only``: the source side of the first step alone)."""
    worst, top = 0.0, 1e-12
    for (cut, scores), (source, target) in zip(ours, theirs, strict=True):
        steps = 1 if first_step_only else min(scores.shape[0], source.shape[0])
        a = scores[:steps, :cut]
        b = source[:steps, : a.shape[1]]
        t = scores[:steps, cut:] if not first_step_only else scores[:0, cut:]
        u = target[:steps, : t.shape[1]] if not first_step_only else np.zeros_like(t)
        top = max(top, float(np.nanmax(np.abs(b))), float(np.abs(np.nan_to_num(u)).max(initial=0.0)))
        worst = max(worst, float(np.nanmax(np.abs(a - b))), float(np.abs(np.nan_to_num(t) - np.nan_to_num(u)).max(initial=0.0)))
    return worst / top


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="an encoder–decoder folder or hub id (default: a seeded Marian, random weights)")
    parser.add_argument("--shape", choices=("tiny", "opus-mt"), default="opus-mt", help="the default model's shape: tiny, or opus-mt's (6+6 layers of width 512)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ig-steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "seq2seq.md")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    model = args.model
    if model is None:
        from heedful.tiny_seq2seq import OPUS_MT_SHAPE, build_tiny_marian

        shape = OPUS_MT_SHAPE if args.shape == "opus-mt" else {}
        model = str(build_tiny_marian(Path(tempfile.mkdtemp(prefix="heedful-seq2seq-")) / f"marian-{args.shape}", **shape))
    m = _load(model, args.threads)
    sources = [SOURCES[i % len(SOURCES)] for i in range(args.n)]
    generation = m.generate(sources, args.steps)
    outputs = [m.tokenizer.decode(ids, skip_special_tokens=True) for ids in generation.continuations]
    kept = [(s, o) for s, o in zip(sources, outputs, strict=True) if o.strip()]
    sources, outputs = [s for s, _ in kept], [o for _, o in kept]
    scaled = bool(getattr(m.hf_model.config, "scale_embedding", False)) and m.adapter.model_type == "marian"
    params = sum(p.numel() for p in m.hf_model.parameters()) / 1e6
    rows = []
    load_before = os.getloadavg()[0]
    for label, (ours, options, theirs, inseq_options, reduce) in METHODS.items():
        if ours == "integrated_gradients":
            options = {**options, "n_steps": args.ig_steps}
            inseq_options = {**inseq_options, "n_steps": args.ig_steps}
        h_seconds, h_memory, h_scores = _fresh(run_heedful, model, args.threads, sources, outputs, ours, options)
        i_seconds, i_memory, i_scores = _fresh(run_inseq, model, args.threads, sources, outputs, theirs, inseq_options, reduce)
        diff = _difference(h_scores, i_scores, first_step_only=scaled)
        rows.append(
            f"| {label} | {fmt_s(h_seconds)} | {fmt_s(i_seconds)} | {i_seconds / h_seconds:.2f}x | "
            f"{h_memory / 2**20:.0f} MiB | {i_memory / 2**20:.0f} MiB | {diff:.1e} |"
        )
        print(rows[-1], flush=True)
    tokens = sum(len(m.adapter.continuation_ids(o)) for o in outputs)
    text = "\n".join(
        [
            "# Encoder–decoder attribution: heedful vs Inseq",
            "",
            f"{len(sources)} sources, {tokens} output tokens (greedy, at most {args.steps} each), every output token "
            "explained over its source and target prefix by each side in a fresh process; time and peak memory of "
            "the attribution call (after a warm-up call on one source).",
            "",
            "| method | heedful | Inseq | Inseq / heedful | heedful peak | Inseq peak | largest difference / largest score |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Differences are over the source side of the first step only for a Marian with scale_embedding: Inseq "
            "0.7.1 scales its decoder's embeddings twice under transformers 5, so later steps and the target side "
            "explain another model." if scaled else "Differences over every step, both sides.",
            "",
            command_line(),
            f"- model: {model} ({m.adapter.described}, {params:.1f}M parameters)",
            f"- machine: {cpu_name()}, torch threads {args.threads}; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
            f"- python {sys.version.split()[0]}, {library_versions('torch', 'transformers', 'inseq')}",
        ]
    )
    write_results(args.out, text + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
