"""Context attribution over long inputs: exact leave-one-source-out without and with the
key/value cache, ContextCite (32 and 64 ablations), hierarchical refinement and AT2 (learned
head weights, and uniform ones: attention averaged over every head), on planted long documents
of 512 to 4,096 tokens, in one run; the report (``--out``) and, beside it, a plot of each
configuration's cost against its agreement with exact LOO per length (the same name, ``.png``).

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
   ``--full-until`` the first document has no exact reference to agree with; documents after it
   (``--long-docs``) agree with the exact LOO the store holds for them (see below). Exact LOO,
   context_cite 64, hierarchical and AT2 run there; the other configurations with ``--all-long``.
4. Agreement with exact LOO: Spearman correlation of the source scores and whether the top
   source is the same; planted accuracy: whether the planted sentence is the top (top-3)
   source. Hierarchical ranks its kept sources by exact LOO and the rest below them by their coarse scores.
   Beside it, what Spearman over all sources is made of: how many sources each configuration
   scores other than exactly zero (a Lasso leaves many at zero, tied) and its Spearman with
   exact LOO over those alone, and how far exact LOO's planted source stands above the rest.

AttriBoT's proxy-model trick (a smaller model of the same family) has no pair to run on here;
the report says why (:data:`PROXY`).

Running time: the wall-time column sums to most of it (each configuration also loads the model
in its fresh process, ~10 s); exact LOO and ContextCite on the first document of each length
dominate, the AT2 rows add one forward per document. AT2's agreement at 4,096 tokens needs the store's
exact LOO documents: ``--long-docs 16`` reads 15 of them (``benchmarks/store/context``) and adds
about 15 AT2 forwards of 4,096 tokens per AT2 configuration.

    python benchmarks/context.py [--model smollm2-135m] [--lengths 512,1024,2048,4096] [--docs 8]
                                 [--long-docs 1] [--subset 6] [--all-long] [--threads 2] [--max-memory 4GB]
                                 [--only "exact LOO, cache;context_cite 64"] [--out benchmarks/results/context.md]

``--only`` runs the named configurations alone (``;``-separated labels); the ratios then name
only the pairs it ran.

Agreement needs exact LOO on every document, about half an hour each at 4,096 tokens, so the
source scores of every document but the first are kept in a store (``--store``, default
``benchmarks/store/context``, one JSON file per configuration and document, committed with the
repository so that documents computed on one machine count on the next), keyed by the model's
fingerprint, the method, its version and bound options, and the document's text, sources and
target: a later run reads them instead of computing them again, and a changed model, method or
document has another key and is computed afresh. The first document of each length is the timed one and is computed by
the run that writes the report, every time. ``--share i/k`` grows the store alone: document by
document (2 onwards, those whose position after the first is ``i`` modulo ``k``: ``k``
processes side by side, one thread each), it computes every configuration the store lacks, each
in a fresh process, then prints the agreement over what the store holds and writes no results
file.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from _shared import command_line, cpu_name, finish, fmt_s, library_versions  # noqa: E402  (benchmarks/ is the script's folder)
from rich.console import Console
from scipy.stats import binomtest, spearmanr

if TYPE_CHECKING:
    from heedful.evaluate.share import Share

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "benchmarks" / "store" / "context"
"""The committed store of per-document results (see the docstring)."""

CONFIGS: dict[str, tuple[str, dict]] = {
    "exact LOO, no cache": ("source_loo", {"kv_cache": False}),
    "exact LOO, cache": ("source_loo", {}),
    "context_cite 32": ("context_cite", {"n_ablations": 32}),
    "context_cite 64": ("context_cite", {"n_ablations": 64}),
    "hierarchical": ("hierarchical", {}),
    "at2": ("at2", {}),
    "at2, uniform heads": ("at2", {"heads": "uniform"}),
}
REFERENCE = "exact LOO, cache"
LONG = ("exact LOO, no cache", "exact LOO, cache", "context_cite 64", "hierarchical", "at2", "at2, uniform heads")
"""What runs beyond ``--full-until`` (``--all-long``: every configuration)."""


def documents(model_name: str, length: int, n: int, seed: int) -> tuple[list[dict], str, tuple[float, float]]:
    """``n`` planted documents of about ``length`` tokens (text, source spans, the planted
    source's index and the target token), the model's fingerprint and its FLOP counts
    (:func:`flop_counts`)."""
    import heedful
    from heedful import datasets
    from heedful.fingerprint import model_fingerprint

    lm = heedful.load(model_name)
    data = datasets.load("planted", "test", n=n, length=length, tokenizer=lm.tokenizer, seed=seed)
    docs = [
        {"text": ex.text, "spans": [tuple(s) for s in ex.meta["sources"]], "planted": ex.meta["answer_source"], "target": ex.target}
        for ex in data
    ]
    return docs, model_fingerprint(lm).digest, flop_counts(lm.adapter.config)


def flop_counts(config) -> tuple[float, float]:
    """A Llama-shaped decoder's forward FLOPs (the benchmark's ``smollm2-135m``): per position through the blocks' linear maps (query and output
    ``D x D``, key and value ``D x (KV heads x head size)``, the gated MLP ``3 x D x F``) and per
    (query, key) pair in attention (``Q K^T`` and the weighted sum of values over all heads), both
    over all blocks; embeddings, norms and the head are left out."""
    d, f, blocks, heads = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", heads) * (d // heads)
    return 2.0 * blocks * (2 * d * d + 2 * d * kv + 3 * d * f), 2.0 * blocks * 2 * d


def expected_ratios(flops: tuple[float, float], tokens: int, sources: int, ablations: int = 64) -> tuple[float, float, float]:
    """Speed-ups FLOP counts predict for a causal model on ``tokens`` positions and ``sources``
    evenly spread sources: a full pass costs ``a N + b N^2 / 2`` (``a``, ``b``: :func:`flop_counts`);
    a cached leave-one-out pass recomputes the text after the source, which attends to all before
    it -- over an even spread, ``a N / 2 + b N^2 / 3``; a ContextCite ablation keeps half the
    text (keep probability 0.5): ``a N / 2 + b N^2 / 8``, plus one full pass. Returns cached vs
    uncached LOO and ContextCite (``ablations``) vs uncached and vs cached LOO."""
    a, b = flops
    n = float(tokens)
    full, cached, ablated = a * n + b * n * n / 2, a * n / 2 + b * n * n / 3, a * n / 2 + b * n * n / 8
    cite = ablations * ablated + full
    return full / cached, sources * full / cite, sources * cached / cite


def unit_key(fingerprint: str, method: str, options: dict, doc: dict) -> str:
    """The store key of ``method`` with ``options`` on ``doc`` over all its sources: the model's
    fingerprint, the method's name, version and bound options (defaults included), and the
    document's text, source spans and target -- what the scores are computed from."""
    from heedful.attribution import get_method
    from heedful.engine.options import canonical_json

    info = get_method(method)
    what = {
        "model": fingerprint, "method": info.name, "version": info.version, "options": info.key_options(info.bind(dict(options))),
        "text": doc["text"], "spans": [list(s) for s in doc["spans"]], "target": doc["target"],
    }
    return hashlib.sha256(canonical_json(what).encode()).hexdigest()[:32]


def stored(store: Path, key: str) -> dict | None:
    path = store / f"{key}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def keep(store: Path, key: str, found: dict) -> None:
    """Write one document's result (atomically: a process stopped mid-write leaves no half file)."""
    from heedful.files.atomic import atomic_file

    with atomic_file(store / f"{key}.json") as part:
        part.write_text(json.dumps(found), encoding="utf-8")


def position_counter(lm) -> list[int]:
    """``[n]``: the token positions every forward of ``lm``'s backbone runs, counted from now
    (reset by setting ``n`` to 0)."""
    positions = [0]

    def count(module, args, kwargs):
        ids = kwargs.get("input_ids")
        ids = kwargs.get("inputs_embeds") if ids is None else ids
        positions[0] += 0 if ids is None else int(ids.shape[0] * ids.shape[1])

    lm.adapter.backbone.register_forward_pre_hook(count, with_kwargs=True)
    return positions


def run_config(
    model_name: str, method: str, options: dict, docs: list[dict], threads: int, max_memory: str, subset: int | None,
    store: Path | None = None, keys: list[str | None] | None = None,
) -> dict:
    """One configuration on ``docs`` in this (fresh) process: seconds, positions computed, peak
    resident memory above the loaded model, source scores (and the planted answer's
    probability). A document with a key in ``keys`` is written to ``store`` as soon as it is
    done."""
    import torch

    import heedful
    from heedful.engine.memory import peak_rss_mb, reset_peak_rss

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    lm = heedful.load(model_name, max_memory=max_memory)
    positions = position_counter(lm)
    lm.explain(docs[0]["text"][:200], "saliency")  # warm-up
    found = []
    for i, doc in enumerate(docs):
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
                "answered": bool(e.prediction.get("index") == e.target.indices[0]),
            }
        )
        if store is not None and keys and keys[i] is not None and sizes == [None]:
            keep(store, keys[i], found[-1])
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
    parser.add_argument("--store", type=Path, default=STORE, help="where documents after the first are kept (default benchmarks/store/context)")
    parser.add_argument("--share", default=None, help="i/k: grow the store alone with every k-th document after the first, from the i-th; no results file")
    args = parser.parse_args(argv)
    share = _parse_share(parser, args.share)
    only = [label.strip() for label in args.only.split(";") if label.strip()]
    unknown = [label for label in only if label not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}; choose from {'; '.join(CONFIGS)}")
    console = Console()
    load_before = os.getloadavg()[0]
    lengths = [int(x) for x in args.lengths.split(",")]
    if share is not None:
        return grow_store(args, lengths, only, share, console)
    rows: dict[int, dict] = {}
    for length in lengths:
        n = args.docs if length <= args.full_until else args.long_docs
        docs, fingerprint, flops = documents(args.model, length, n, args.seed)
        console.print(f"[bold]{length} tokens[/bold]: {n} document(s), {np.mean([len(d['spans']) for d in docs]):.0f} sources on average")
        results = {}
        for label, method, options, subset in configurations(args, length, only):
            use = docs[:1] if label == "exact LOO, no cache" else docs
            # documents after the first, over all their sources, come from the store when it holds
            # them -- also where this run times exact LOO on a subset of the first document's sources
            keys = [None] + [unit_key(fingerprint, method, options, d) for d in use[1:]]
            have = {i: stored(args.store, k) for i, k in enumerate(keys) if k is not None}
            todo = [i for i in range(len(use)) if have.get(i) is None]
            began = time.perf_counter()
            computed = measure((args.model, method, options, [use[i] for i in todo], args.threads, args.max_memory, subset, args.store, [keys[i] for i in todo]))
            done = dict(zip(todo, computed["docs"], strict=True))
            results[label] = {"docs": [done.get(i) or have.get(i) for i in range(len(use))], "from_store": len(use) - len(todo)}
            console.print(f"  {label}: {len(todo)} computed, {len(use) - len(todo)} from the store, {fmt_s(time.perf_counter() - began)} (process included)")
        rows[length] = {"docs": docs, "results": results, "flops": flops}
        if REFERENCE not in results:  # the configurations agree with the exact LOO the store holds
            method, options = CONFIGS[REFERENCE]
            rows[length]["reference"] = {"docs": [None] + [stored(args.store, unit_key(fingerprint, method, options, d)) for d in docs[1:]]}
    text = report(rows, args, load_before)
    console.print(f"wrote {plot(rows, args.out.with_suffix('.png'))}")
    return finish(text, args, console)


def configurations(args: argparse.Namespace, length: int, only: list[str]) -> list[tuple[str, str, dict, int | None]]:
    """The configurations run at ``length``: label, method, options and the sources exact LOO
    times (``None``: all of them)."""
    chosen = []
    for label, (method, options) in CONFIGS.items():
        if (length > args.full_until and not args.all_long and label not in LONG) or (only and label not in only):
            continue
        chosen.append((label, method, options, args.subset if method == "source_loo" and length > args.full_until else None))
    return chosen


def grow_store(args: argparse.Namespace, lengths: list[int], only: list[str], share: Share, console: Console) -> int:
    """``--share i/k``: document by document, every configuration over all sources that the
    store lacks, each in a fresh process; then the agreement over what the store holds."""
    rows: dict[int, dict] = {}
    for length in lengths:
        n = args.docs if length <= args.full_until else args.long_docs
        docs, fingerprint, _ = documents(args.model, length, n, args.seed)
        stored_configs = [c for c in configurations(args, length, only) if c[0] != "exact LOO, no cache"]
        chosen = [(label, method, options) for label, method, options, _ in stored_configs]
        if any(subset is not None for *_, subset in stored_configs):
            console.print(f"[yellow]{length} tokens: exact LOO is timed on a subset of sources beyond --full-until; pass --full-until {length} to store it[/yellow]")
            continue
        found: dict[str, list] = {label: [None] * n for label, *_ in chosen}
        for i in range(1, n):
            for label, method, options in chosen:
                key = unit_key(fingerprint, method, options, docs[i])
                found[label][i] = stored(args.store, key)
                if found[label][i] is None and share.takes(i - 1):
                    began = time.perf_counter()
                    found[label][i] = measure((args.model, method, options, [docs[i]], args.threads, args.max_memory, None, args.store, [key]))["docs"][0]
                    console.print(f"  {length} tokens, document {i + 1}, {label}: {fmt_s(time.perf_counter() - began)} (process included)")
        rows[length] = {"docs": docs, "results": {label: {"docs": d} for label, d in found.items()}}
    for line in agreement_lines(rows) + spearman_lines(rows):
        console.print(line)
    console.print(f"[dim]share {share}: the store {args.store} grew; no results file written[/dim]")
    return 0


def report(rows: dict[int, dict], args: argparse.Namespace, load_before: float) -> str:
    from heedful.engine.chunks import TOKEN_BUDGET

    lines = [
        "# Context attribution over long inputs: exact leave-one-source-out, cached and not, ContextCite, hierarchical, AT2",
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
        for label, result in results.items():
            first = result["docs"][0]
            projected = first["timed_sources"] != first["all_sources"]
            seconds, positions = first["seconds"], first["positions"]
            rhos, tops, hit1, hit3 = ([], [], [], []) if projected else accuracy(docs, result, reference_of(row))
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
        reference = reference_of(row)
        for label, result in results.items():
            pairs = [
                (truth["seconds"], found["seconds"])
                for found, truth in zip(result["docs"][1:], (reference or {"docs": []})["docs"][1:], strict=False)
                if not label.startswith("exact") and found and truth and truth["timed_sources"] == truth["all_sources"]
            ]
            if pairs:
                summary.append(
                    f"  - {label} vs exact LOO with the cache on the same documents after the first: {np.median([t / f for t, f in pairs]):.1f}x faster "
                    f"(median over {len(pairs)}; each time from the run that computed it)"
                )
        first = next(iter(results.values()))["docs"][0]
        cached_x, cite_x, cite_cached_x = expected_ratios(row["flops"], first["tokens"], first["all_sources"])
        summary.append(
            f"  - FLOP counts predict (the first document, {first['tokens']} tokens, {first['all_sources']} sources): cached LOO {cached_x:.2f}x faster than uncached; "
            f"context_cite 64 {cite_x:.2f}x faster than exact LOO without the cache, {cite_cached_x:.2f}x than with it"
        )
        if uncached_s and cached_s:
            cached, uncached = results[REFERENCE]["docs"][0]["scores"], results["exact LOO, no cache"]["docs"][0]["scores"]
            if len(cached) == len(uncached):
                summary.append(f"  - cached vs uncached LOO scores, largest difference {np.abs(np.subtract(cached, uncached)).max():.2e}")
    from_store = sum(r.get("from_store", 0) for row in rows.values() for r in row["results"].values())
    lines += [
        "", "## Targets", "", *target_lines(rows),
        "", "## Ratios", "", *summary, "",
        "## Agreement and planted accuracy with 95 % Wilson intervals", "",
        f"Documents after the first read from the store ({from_store} configuration-document results; see the script's docstring) or computed in this run.",
        "", *agreement_lines(rows), "",
        "## Why Spearman with exact LOO stays low while the top source agrees", "",
        *spearman_lines(rows), "", "## Memory", "",
    ]
    forward_only = ["exact LOO, cache", "context_cite 64"]
    for label in forward_only:
        peaks = {length: rows[length]["results"][label]["docs"][0]["peak_mb"] for length in rows if label in rows[length]["results"]}
        if not peaks:
            continue
        shown = ", ".join(f"{length}: {peak:.0f} MB" for length, peak in peaks.items())
        lines.append(f"- {label}: peak above the model {shown}")
        if 1024 in peaks and 4096 in peaks and peaks[1024] > 0:
            lines.append(f"  - 4,096 vs 1,024 tokens: {peaks[4096] / peaks[1024]:.2f}x")
    lines += ["", "## Cost against agreement", "", f"![wall time against agreement with exact LOO]({args.out.with_suffix('.png').name})", "",
              "Per length, each configuration's wall time on the first document (hollow: projected from a subset of sources) against its mean "
              "Spearman correlation with exact LOO and its share of documents whose top source is exact LOO's (bars: 95 % Wilson interval), "
              "over the documents whose exact LOO covers every source.", ""]
    lines += ["## AttriBoT's proxy model", "", PROXY]
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


PROXY = (
    "AttriBoT (Liu et al. 2024) approximates a large model's leave-one-out with a smaller model of the same family, "
    "which shares its tokenizer and was trained on the same data. No such pair can be built here: `smollm2-135m` is the smallest "
    "SmolLM2 (135M parameters; the family's larger sizes, 360M and 1.7B, cannot be had on these machines: no model hub is "
    "reachable and no package ships them), so the zoo has no smaller SmolLM2 to stand in for it, and no larger one for it to "
    "stand in for. heedful therefore offers no `proxy=` option; with a local copy of a larger SmolLM2, `smollm2-135m`'s exact "
    "LOO is the proxy AttriBoT describes."
)
"""What the report says of AttriBoT's proxy-model trick (docs/design.md says the same)."""


def plot(rows: dict[int, dict], path: Path) -> Path:
    """Per length (one row of panels), each configuration's wall time on the first document
    (log scale; hollow where projected) against its mean Spearman with exact LOO and its top-1
    agreement with exact LOO (95 % Wilson interval), over the documents with a full reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = list(rows)
    fig, axes = plt.subplots(len(lengths), 2, figsize=(11, 3.4 * len(lengths)), squeeze=False)
    colours = {label: plt.get_cmap("tab10")(i % 10) for i, label in enumerate(CONFIGS)}
    for axis_row, length in zip(axes, lengths, strict=True):
        results = rows[length]["results"]
        for label, result in results.items():
            first = result["docs"][0]
            projected = first["timed_sources"] != first["all_sources"]
            rhos, tops, _, _ = accuracy(rows[length]["docs"], result, reference_of(rows[length]))
            finite = [r for r in rhos if np.isfinite(r)]
            style = {"color": colours[label], "markerfacecolor": "none" if projected else colours[label], "marker": "o", "markersize": 7}
            if finite:
                axis_row[0].plot([first["seconds"]], [np.mean(finite)], linestyle="none", label=f"{label} ({len(finite)} docs)", **style)
                axis_row[0].annotate(label, (first["seconds"], np.mean(finite)), textcoords="offset points", xytext=(5, 4), fontsize=7)
            if tops:
                ci = binomtest(int(sum(tops)), len(tops)).proportion_ci(method="wilson")
                share = float(np.mean(tops))
                axis_row[1].errorbar([first["seconds"]], [share], yerr=[[share - ci.low], [ci.high - share]], capsize=3, linestyle="none", **style)
                axis_row[1].annotate(f"{label} ({sum(tops)}/{len(tops)})", (first["seconds"], share), textcoords="offset points", xytext=(5, -10), fontsize=7)
        tokens = next(iter(results.values()))["docs"][0]["tokens"]
        for ax, what in zip(axis_row, ("Spearman with exact LOO", "top-1 = exact LOO"), strict=True):
            ax.set_xscale("log")
            ax.margins(x=0.25)
            ax.set_xlabel("wall time per document (s)")
            ax.set_ylabel(what)
            ax.set_title(f"{tokens} tokens")
            ax.set_ylim(-0.25 if what.startswith("Spearman") else -0.05, 1.05)
            ax.grid(alpha=0.3)
        axis_row[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def reference_of(row: dict) -> dict | None:
    """Exact LOO's results at a length: this run's, else the store's for the documents after the
    first (a run of other configurations alone, ``--only``)."""
    return row["results"].get(REFERENCE) or row.get("reference")


def accuracy(docs: list[dict], result: dict, reference: dict | None) -> tuple[list[float], list[bool], list[bool], list[bool]]:
    """Over the documents ``result`` holds: Spearman with exact LOO and whether the top source is
    the same (documents the reference holds over all sources), whether the planted source is the
    top (top-3) source (every document: planted accuracy needs no reference)."""
    exact = reference["docs"] if reference else []
    rhos, tops, hit1, hit3 = [], [], [], []
    for i, (doc, found) in enumerate(zip(docs, result["docs"], strict=False)):
        if found is None or found["timed_sources"] != found["all_sources"]:
            continue
        truth = exact[i] if i < len(exact) else None
        if truth is not None and truth["timed_sources"] == truth["all_sources"]:
            rho, same = _agreement(found["scores"], truth["scores"])
            rhos.append(rho)
            tops.append(same)
        order = np.argsort(-np.asarray(found["scores"]), kind="stable")
        hit1.append(bool(order[0] == doc["planted"]))
        hit3.append(doc["planted"] in order[:3])
    return rhos, tops, hit1, hit3


HIERARCHICAL_SPEED = 20.0
"""Issue target: ``hierarchical`` at least this many times faster than exact LOO with the cache at 4,096 tokens."""
HIERARCHICAL_TOP1 = 0.9
"""Issue target: the share of documents whose top source under ``hierarchical`` is exact LOO's."""


def target_lines(rows: dict[int, dict]) -> list[str]:
    """The cheap-context targets, each marked holds / does not hold: ``hierarchical``'s speed
    against exact LOO with the cache at the longest length (the first document's times, both
    measured in this run; the store's times of later documents come from other runs, often at
    another thread count, so they mark no target), and its top-1 agreement with exact LOO over every document of every length that has
    a full reference (95 % Wilson interval)."""
    label = "hierarchical"
    longest = max((length for length, row in rows.items() if label in row["results"]), default=None)
    if longest is None:
        return ["- hierarchical was not run: no target to mark"]
    row = rows[longest]
    found = row["results"][label]["docs"]
    reference = reference_of(row)
    lines = []
    truth = reference["docs"][0] if reference and reference["docs"] and reference["docs"][0] else None
    if truth is not None and found[0]:
        ratio = truth["seconds"] / found[0]["seconds"]
        projected = " (exact LOO projected from a subset of its sources)" if truth["timed_sources"] != truth["all_sources"] else ""
        verdict = "holds" if ratio >= HIERARCHICAL_SPEED else "does not hold"
        lines.append(
            f"- hierarchical ≥ {HIERARCHICAL_SPEED:g}× faster than exact LOO with the cache at {found[0]['tokens']} tokens: **{verdict}** "
            f"({ratio:.1f}×: {fmt_s(truth['seconds'])} against {fmt_s(found[0]['seconds'])} on the first document{projected})"
        )
    tops = [top for length, r in rows.items() if label in r["results"] for top in accuracy(r["docs"], r["results"][label], reference_of(r))[1]]
    if tops:
        ci = binomtest(int(sum(tops)), len(tops)).proportion_ci(method="wilson")
        verdict = "holds" if np.mean(tops) >= HIERARCHICAL_TOP1 else "does not hold"
        lines.append(
            f"- hierarchical's top source = exact LOO's in ≥ {HIERARCHICAL_TOP1:g} of the documents (every length): **{verdict}** "
            f"({_share(tops, interval=True)}; the interval's lower end {'reaches' if ci.low >= HIERARCHICAL_TOP1 else 'is below'} {HIERARCHICAL_TOP1:g})"
        )
    return lines


def agreement_lines(rows: dict[int, dict]) -> list[str]:
    """Per length and configuration: agreement with exact LOO and planted accuracy over every
    document at hand, shares with their 95 % Wilson intervals."""
    lines = []
    for length, row in rows.items():
        for label, result in row["results"].items():
            rhos, tops, hit1, hit3 = accuracy(row["docs"], result, reference_of(row))
            lines.append(
                f"- {length} tokens, {label}: top-1 = exact LOO {_share(tops, interval=True)}; planted top-1 {_share(hit1, interval=True)}, "
                f"top-3 {_share(hit3, interval=True)}; Spearman vs exact LOO {_mean(rhos)}"
            )
    return lines


def spearman_lines(rows: dict[int, dict]) -> list[str]:
    """Per length, over the documents whose exact LOO covers every source: how many sources each
    configuration scores other than exactly zero (ContextCite's Lasso leaves many at zero, tied)
    and its Spearman with exact LOO over those sources alone; and how far exact LOO's planted
    source stands above the rest (its score over the next largest, and the other sources'
    absolute scores as a share of the planted one's, medians over documents)."""
    lines = []
    for length, row in rows.items():
        reference = reference_of(row)
        if reference is None:
            continue
        pairs = {
            label: [
                (np.asarray(found["scores"]), np.asarray(truth["scores"]), doc["planted"])
                for doc, found, truth in zip(row["docs"], result["docs"], reference["docs"], strict=False)
                if found is not None and truth is not None and found["timed_sources"] == found["all_sources"] == truth["timed_sources"]
            ]
            for label, result in row["results"].items()
        }
        for label, found in pairs.items():
            if label.startswith("exact") or not found:
                continue
            nonzero = [ours != 0 for ours, _, _ in found]
            rhos = [float(spearmanr(ours[nz], exact[nz]).statistic) for (ours, exact, _), nz in zip(found, nonzero, strict=True) if nz.sum() > 2]
            lines.append(
                f"- {length} tokens, {label}: a score other than zero for {np.mean([nz.sum() for nz in nonzero]):.1f} of "
                f"{np.mean([len(nz) for nz in nonzero]):.0f} sources on average; Spearman with exact LOO over those sources {_mean(rhos)} "
                f"({len(rhos)} of {len(found)} documents have 3 or more), over all sources {_mean([_agreement(o, e)[0] for o, e, _ in found])}"
            )
        exact = [(e, e, p) for _, e, p in pairs[next(iter(pairs))]] if REFERENCE not in pairs and pairs else pairs.get(REFERENCE)
        if exact:
            above = [e[p] / np.delete(e, p).max() for _, e, p in exact if np.delete(e, p).max() > 0]
            rest = [np.median(np.abs(np.delete(e, p))) / abs(e[p]) for _, e, p in exact if e[p] != 0]
            lines.append(
                f"- {length} tokens, exact LOO: the planted source's score is {np.median(above):.1f}x the next largest source's; "
                f"the other sources' absolute scores are {np.median(rest):.4f} of the planted one's (medians over {len(exact)} documents)"
            )
    return lines


def _parse_share(parser: argparse.ArgumentParser, value: str | None) -> Share | None:
    from heedful.errors import HeedfulError
    from heedful.evaluate.share import Share

    if value is None:
        return None
    try:
        return Share.parse(value, "--share")
    except HeedfulError as exc:
        parser.error(f"{exc.message}; {exc.hint}")


def _mean(values: list[float]) -> str:
    finite = [v for v in values if np.isfinite(v)]
    return f"{np.mean(finite):.3f}" if finite else "--"


def _share(values: list[bool], interval: bool = False) -> str:
    """``0.80 (4/5)``; with ``interval``, its 95 % Wilson score interval too."""
    if not values:
        return "--"
    text = f"{np.mean(values):.2f} ({sum(values)}/{len(values)})"
    if interval:
        ci = binomtest(int(sum(values)), len(values)).proportion_ci(method="wilson")
        text += f" [{ci.low:.2f}, {ci.high:.2f}]"
    return text


if __name__ == "__main__":
    raise SystemExit(main())
