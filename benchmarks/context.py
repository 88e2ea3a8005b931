"""Context attribution over long inputs: exact leave-one-source-out without and with the
key/value cache, ContextCite (32 and 64 ablations) and hierarchical refinement, on planted
long documents of 512 to 4,096 tokens, in one run.

1. For each length, ``--docs`` planted documents (``heedful.datasets.load("planted")``: movie
   review sentences, distractor sentences of the same template, one planted answer sentence,
   then the question; every sentence of the document is a source, the question is none) are
   explained for the planted answer token (the model's next token after the question).
2. Each configuration runs in a fresh process on the same documents: the attribution call's
   wall time, the token positions the model computed (a hook on the backbone counts every
   pass, the reference pass included) and the peak resident memory above the loaded model
   (VmHWM reset after loading) are recorded, with the source scores.
3. Exact leave-one-source-out is the reference: with the cache (``source_loo``, the default)
   on every document, without it (``kv_cache=False``) on the first; both on all sources up to
   ``--full-until`` tokens, beyond that on ``--subset`` and twice as many sources spread evenly
   over the document, whose times and positions give a fixed part (the reference pass, the
   cache) and a part per source, projected to all sources and marked "projected" (the uncached
   cost per source is nearly constant -- each pass runs the whole document less one sentence;
   the cached cost grows with the text after the source, which an even spread samples). The two agree to float rounding (the largest difference is printed). Beyond
   ``--full-until`` there is no exact reference to agree with: context_cite 64 reports planted
   accuracy only, and the other configurations run there with ``--all-long``.
4. Agreement with exact LOO: Spearman correlation of the source scores and whether the top
   source is the same; planted accuracy: whether the planted sentence is the top (top-3)
   source. Hierarchical ranks sources by the summed token scores of the sources it kept.

    python benchmarks/context.py [--model smollm2-135m] [--lengths 512,1024,2048,4096] [--docs 8]
                                 [--long-docs 1] [--subset 6] [--all-long] [--threads 2] [--max-memory 4GB]
                                 [--only "exact LOO, cache;context_cite 64"] [--out benchmarks/results/context.md]

``--only`` runs the named configurations alone (``;``-separated labels); the ratios then name
only the pairs it ran.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from _shared import command_line, cpu_name, finish, fmt_s, library_versions  # noqa: E402  (benchmarks/ is the script's folder)
from rich.console import Console
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parent.parent

CONFIGS: dict[str, tuple[str, dict]] = {
    "exact LOO, no cache": ("source_loo", {"kv_cache": False}),
    "exact LOO, cache": ("source_loo", {}),
    "context_cite 32": ("context_cite", {"n_ablations": 32}),
    "context_cite 64": ("context_cite", {"n_ablations": 64}),
    "hierarchical": ("hierarchical", {}),
}
REFERENCE = "exact LOO, cache"
LONG = ("exact LOO, no cache", "exact LOO, cache", "context_cite 64")
"""What runs beyond ``--full-until`` (``--all-long``: every configuration)."""


def documents(model_name: str, length: int, n: int, seed: int) -> list[dict]:
    """``n`` planted documents of about ``length`` tokens: text, source spans, the planted
    source's index and the target token."""
    import heedful
    from heedful import datasets

    lm = heedful.load(model_name)
    data = datasets.load("planted", "test", n=n, length=length, tokenizer=lm.tokenizer, seed=seed)
    return [
        {"text": ex.text, "spans": [tuple(s) for s in ex.meta["sources"]], "planted": ex.meta["answer_source"], "target": ex.target}
        for ex in data
    ]


def run_config(model_name: str, method: str, options: dict, docs: list[dict], threads: int, max_memory: str, subset: int | None) -> dict:
    """One configuration on ``docs`` in this (fresh) process: seconds, positions computed, peak
    resident memory above the loaded model, source scores (and the planted answer's
    probability)."""
    import torch

    import heedful
    from heedful.memory import peak_rss_mb, reset_peak_rss

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    lm = heedful.load(model_name, max_memory=max_memory)
    positions = [0]

    def count(module, args, kwargs):
        ids = kwargs.get("input_ids")
        ids = kwargs.get("inputs_embeds") if ids is None else ids
        positions[0] += 0 if ids is None else int(ids.shape[0] * ids.shape[1])

    lm.adapter.backbone.register_forward_pre_hook(count, with_kwargs=True)
    lm.explain(docs[0]["text"][:200], "saliency")  # warm-up
    found = []
    for doc in docs:
        sizes = [None] if subset is None or 2 * subset >= len(doc["spans"]) else [subset, 2 * subset]
        runs = []
        for size in sizes:
            spans = doc["spans"] if size is None else [doc["spans"][i] for i in np.linspace(0, len(doc["spans"]) - 1, size).round().astype(int)]
            positions[0] = 0
            reset_peak_rss()
            base = peak_rss_mb()
            began = time.perf_counter()
            e = lm.explain(doc["text"], method, target=doc["target"], sources=spans, **options)
            runs.append({"seconds": time.perf_counter() - began, "positions": positions[0], "peak_mb": peak_rss_mb() - base, "sources": len(spans)})
        found.append(
            {
                "seconds": _projected(runs, "seconds", len(doc["spans"])),
                "positions": _projected(runs, "positions", len(doc["spans"])),
                "peak_mb": max(r["peak_mb"] for r in runs),
                "scores": e.source_scores().scores.tolist(),
                "timed_sources": runs[-1]["sources"],
                "all_sources": len(doc["spans"]),
                "tokens": len(e.tokens),
                "probability": e.prediction.get("probability"),
                "answered": e.prediction.get("index") == e.target.indices[0],
            }
        )
    return {"docs": found}


def _projected(runs: list[dict], key: str, sources: int) -> float:
    """``key`` of one run over every source, or -- from runs over ``k1`` and ``k2`` evenly spread
    sources -- the line through them at ``sources``: a fixed part (the reference pass, the
    cache) plus a part per source."""
    if len(runs) == 1:
        return float(runs[0][key])
    (k1, v1), (k2, v2) = ((r["sources"], r[key]) for r in runs)
    return float(v1 + (sources - k1) * (v2 - v1) / (k2 - k1))


def measure(args: tuple) -> dict:
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(run_config, *args).result()


def _agreement(ours: list[float], exact: list[float]) -> tuple[float, bool]:
    rho = float(spearmanr(ours, exact).statistic) if len(ours) > 2 else float("nan")
    return rho, int(np.argmax(ours)) == int(np.argmax(exact))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", default="512,1024,2048,4096")
    parser.add_argument("--docs", type=int, default=2, help="planted documents per length up to --full-until")
    parser.add_argument("--long-docs", type=int, default=1, help="planted documents per longer length")
    parser.add_argument("--full-until", type=int, default=1024, help="longest length timed on every source without the cache")
    parser.add_argument("--subset", type=int, default=6, help="sources timed by exact LOO beyond --full-until")
    parser.add_argument("--all-long", action="store_true", help="run every configuration beyond --full-until, not only exact LOO and context_cite 64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-memory", default="4GB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="';'-separated configuration labels to run (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "context.md")
    args = parser.parse_args(argv)
    only = [label.strip() for label in args.only.split(";") if label.strip()]
    unknown = [label for label in only if label not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}; choose from {'; '.join(CONFIGS)}")
    console = Console()
    load_before = os.getloadavg()[0]
    lengths = [int(x) for x in args.lengths.split(",")]
    rows: dict[int, dict] = {}
    for length in lengths:
        n = args.docs if length <= args.full_until else args.long_docs
        docs = documents(args.model, length, n, args.seed)
        console.print(f"[bold]{length} tokens[/bold]: {n} document(s), {np.mean([len(d['spans']) for d in docs]):.0f} sources on average")
        results = {}
        for label, (method, options) in CONFIGS.items():
            if length > args.full_until and not args.all_long and label not in LONG:
                continue
            if only and label not in only:
                continue
            uncached = label == "exact LOO, no cache"
            subset = args.subset if method == "source_loo" and length > args.full_until else None
            use = docs[:1] if uncached else docs
            began = time.perf_counter()
            results[label] = measure((args.model, method, options, use, args.threads, args.max_memory, subset))
            console.print(f"  {label}: {fmt_s(time.perf_counter() - began)} (process included)")
        rows[length] = {"docs": docs, "results": results}
    text = report(rows, args, load_before)
    return finish(text, args, console)


def report(rows: dict[int, dict], args: argparse.Namespace, load_before: float) -> str:
    from heedful.chunks import TOKEN_BUDGET

    lines = [
        "# Context attribution over long inputs: exact leave-one-source-out, cached and not, ContextCite, hierarchical",
        "",
        f"`{args.model}`, planted documents (`heedful.datasets.load(\"planted\")`), every sentence a source, the target the planted answer token. "
        f"Times and positions are per document (the first document of each length; its configuration ran alone in a fresh process), "
        f"peak memory is the resident set above the loaded model, max_memory={args.max_memory}, at most {TOKEN_BUDGET:,} positions per pass (the runner's token budget). Agreement and planted accuracy are over all documents of the length.",
        "",
        "| tokens | sources | method | wall time | positions computed | peak memory | Spearman vs exact LOO | top-1 = exact LOO | planted top-1 | planted top-3 |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary = []
    for length, row in rows.items():
        docs, results = row["docs"], row["results"]
        reference = results.get(REFERENCE)
        exact = [d["scores"] for d in reference["docs"]] if reference else []
        complete = bool(reference) and reference["docs"][0]["timed_sources"] == reference["docs"][0]["all_sources"]
        for label, result in results.items():
            first = result["docs"][0]
            projected = first["timed_sources"] != first["all_sources"]
            seconds, positions = first["seconds"], first["positions"]
            rhos, tops, hit1, hit3 = [], [], [], []
            if not projected:
                for i, (doc, found) in enumerate(zip(docs, result["docs"], strict=False)):
                    if complete and i < len(exact):  # planted accuracy needs no reference
                        rho, same = _agreement(found["scores"], exact[i])
                        rhos.append(rho)
                        tops.append(same)
                    order = np.argsort(-np.asarray(found["scores"]), kind="stable")
                    hit1.append(order[0] == doc["planted"])
                    hit3.append(doc["planted"] in order[:3])
            mark = " (projected)" if projected else ""
            lines.append(
                f"| {first['tokens']} | {first['all_sources']} | {label} | {fmt_s(seconds)}{mark} | {positions / 1e3:,.0f} k{mark} | "
                f"{first['peak_mb']:.0f} MB | {_mean(rhos)} | {_share(tops)} | {_share(hit1)} | {_share(hit3)} |"
            )
        times = {label: r["docs"][0]["seconds"] for label, r in results.items()}
        uncached_s, cached_s = times.get("exact LOO, no cache"), times.get("exact LOO, cache")
        parts = [f"cached LOO {uncached_s / cached_s:.2f}x faster than uncached"] if uncached_s and cached_s else []
        for label, seconds in times.items():
            if label.startswith("exact"):
                continue
            against = [
                f"{base / seconds:.2f}x faster than exact LOO {name}"
                for base, name in ((uncached_s, "without the cache"), (cached_s, "with the cache"))
                if base
            ]
            if against:
                parts.append(f"{label} {', '.join(against)}")
        summary.append(f"- {length} tokens: {'; '.join(parts) or 'no pair to compare'}")
        if uncached_s and cached_s:
            cached, uncached = results[REFERENCE]["docs"][0]["scores"], results["exact LOO, no cache"]["docs"][0]["scores"]
            if len(cached) == len(uncached):
                summary.append(f"  - cached vs uncached LOO scores, largest difference {np.abs(np.subtract(cached, uncached)).max():.2e}")
    lines += ["", "## Ratios", "", *summary, "", "## Memory", ""]
    forward_only = ["exact LOO, cache", "context_cite 64"]
    for label in forward_only:
        peaks = {length: rows[length]["results"][label]["docs"][0]["peak_mb"] for length in rows if label in rows[length]["results"]}
        if not peaks:
            continue
        shown = ", ".join(f"{length}: {peak:.0f} MB" for length, peak in peaks.items())
        lines.append(f"- {label}: peak above the model {shown}")
        if 1024 in peaks and 4096 in peaks and peaks[1024] > 0:
            lines.append(f"  - 4,096 vs 1,024 tokens: {peaks[4096] / peaks[1024]:.2f}x")
    lines += ["", "## Planted answers", ""]
    for length, row in rows.items():
        found = next(iter(row["results"].values()))["docs"] if REFERENCE not in row["results"] else row["results"][REFERENCE]["docs"]
        said = [bool(f["answered"]) for f in found]
        probs = [f["probability"] for f in found if f["probability"] is not None]
        lines.append(f"- {length} tokens: the model predicts the planted answer in {sum(said)}/{len(said)} documents (mean probability of its prediction {np.mean(probs):.2f})")
    load_after = os.getloadavg()[0]
    lines += [
        "",
        "## Set-up",
        "",
        command_line(),
        f"- machine: {cpu_name()}, {os.cpu_count()} logical cores, {args.threads} torch threads; load average {load_before:.2f} before, {load_after:.2f} after",
        f"- python {sys.version.split()[0]}, {library_versions('torch', 'transformers', 'scikit-learn')}",
    ]
    return "\n".join(lines) + "\n"


def _mean(values: list[float]) -> str:
    finite = [v for v in values if np.isfinite(v)]
    return f"{np.mean(finite):.3f}" if finite else "--"


def _share(values: list[bool]) -> str:
    return f"{np.mean(values):.2f} ({sum(values)}/{len(values)})" if values else "--"


if __name__ == "__main__":
    raise SystemExit(main())
