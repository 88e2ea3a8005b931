"""Which cheap method should rank the sources for ``hierarchical``: the planted source's rank
among all sources under each coarse method's per-source sums, on the planted long documents of
``benchmarks/context.py`` (``smollm2-135m``, every sentence a source, the planted answer token
the target).

``hierarchical`` refines only the ``keep`` (3) best sources of its coarse ranking, so a planted
source ranked below 3 is lost before refinement starts. For each length and coarse method the
report gives the share of documents where the planted source ranks first and within the top 3
(95 % Wilson intervals) and the worst rank seen.

    python benchmarks/hierarchical_coarse.py [--lengths 512,1024,2048] [--docs 8] [--out benchmarks/results/hierarchical_coarse.md]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from _shared import (  # (benchmarks/ is the script's folder)
    command_line,
    cpu_name,
    finish,
    library_versions,
)
from context import _share, documents
from rich.console import Console
from scipy.stats import binomtest

COARSE = ("saliency", "grad_x_input", "raw_attention")
"""The single-pass coarse methods ``hierarchical`` takes (``source_loo`` and ``context_cite``
are the expensive ones the hierarchy avoids)."""


def planted_ranks(model, docs: list[dict], method: str) -> list[int]:
    """Per document, the planted source's rank (1 = highest) under ``method``'s token scores
    summed per source, ties counted against it."""
    ranks = []
    for doc in docs:
        pooled = model.explain(doc["text"], method, target=doc["target"], sources=doc["spans"]).source_scores().scores
        ranks.append(int((pooled >= pooled[doc["planted"]]).sum()))
    return ranks


def _row(tokens: str, sources: str, method: str, ranks: list[int]) -> str:
    return (
        f"| {tokens} | {sources} | {method} | {_share([r == 1 for r in ranks], interval=True)} | "
        f"{_share([r <= 3 for r in ranks], interval=True)} | {max(ranks)} | {', '.join(map(str, ranks))} |"
    )


def overlap_lines(pooled: dict[str, list[int]]) -> list[str]:
    """Whether the 95 % Wilson intervals of the default coarse method (the first of
    :data:`COARSE`) and of each other one overlap, over all documents, for rank 1 and top 3."""
    first, *others = pooled

    def interval(ranks: list[int], cut: int) -> tuple[float, float]:
        ci = binomtest(sum(r <= cut for r in ranks), len(ranks)).proportion_ci(method="wilson")
        return ci.low, ci.high

    lines = []
    for cut, what in ((1, "ranks the planted source first"), (3, "keeps it in the top 3")):
        a = interval(pooled[first], cut)
        for other in others:
            b = interval(pooled[other], cut)
            verdict = "overlap" if a[0] <= b[1] and b[0] <= a[1] else "do not overlap"
            lines.append(f"- over all documents, how often each {what}: {first} [{a[0]:.2f}, {a[1]:.2f}] and {other} [{b[0]:.2f}, {b[1]:.2f}]: the intervals {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", default="512,1024,2048")
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "hierarchical_coarse.md")
    args = parser.parse_args(argv)
    import torch

    import heedful

    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    load_before, began = os.getloadavg()[0], time.perf_counter()
    model = heedful.load(args.model)
    lines = [
        "# hierarchical: which coarse method keeps the planted source",
        "",
        f"`{args.model}`, the first {args.docs} planted documents per length (`benchmarks/context.py`'s set, seed {args.seed}), "
        "every sentence a source, the target the planted answer token. Rank of the planted source under each coarse method's "
        "token scores summed per source (1 = highest; ties count against it); `hierarchical` refines the top 3 (`keep=3`).",
        "",
        "| tokens | sources | coarse method | planted rank 1 | planted in top 3 | worst rank | ranks per document |",
        "|---:|---:|---|---|---|---:|---|",
    ]
    pooled: dict[str, list[int]] = {method: [] for method in COARSE}
    for length in (int(x) for x in args.lengths.split(",")):
        docs, _, _ = documents(args.model, length, args.docs, args.seed)
        sources = int(np.median([len(d["spans"]) for d in docs]))
        for method in COARSE:
            ranks = planted_ranks(model, docs, method)
            console.print(f"{length} tokens, {method}: {ranks}")
            pooled[method] += ranks
            lines.append(_row(f"{length:,}", str(sources), method, ranks))
    lines += [_row("all", "", method, ranks) for method, ranks in pooled.items()]
    lines += ["", *overlap_lines(pooled)]
    lines += [
        "",
        "## Set-up",
        command_line(),
        f"- machine: {cpu_name()}, {args.threads} torch thread(s); 1-minute load {load_before:.2f} → {os.getloadavg()[0]:.2f}; "
        f"{library_versions('torch', 'transformers')}; run time {(time.perf_counter() - began) / 60:.1f} min",
    ]
    return finish("\n".join(lines) + "\n", args, console)


if __name__ == "__main__":
    raise SystemExit(main())
