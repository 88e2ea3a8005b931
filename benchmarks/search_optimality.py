"""How much better the search rows' own candidates could be ordered: for each frontier row, the
best reordering of its top ``P`` tokens (``heedful.evaluate.aopc_ceiling(..., pool=P)``, exact by
dynamic programming over their subsets) against what the row stored, on sentences of any length.

The exact ceiling (``benchmarks/aopc_ceiling.py``) covers only sentences short enough for
``2^M`` passes. On longer ones this measures the part of the gap a better ordering of the same
candidates could close: if the best reordering of a search row's top ``P`` scores what the row
already scores, the search has found the best ordering of those tokens, and a larger margin over
a peer needs other tokens -- not a better search of these. It reads the frontier's store and
computes only the reorderings; run ``benchmarks/frontier.py`` first.

    python benchmarks/search_optimality.py [--rows LABEL,...] [--n 40] [--pool 10] [--threads 2]
        [--store DIR] [--out docs/results/search-optimality.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _shared import command_line, library_versions, run_line, write_results  # noqa: E402  (benchmarks/ is the script's folder)
from frontier import MODELS, labels, offered, setup, share_of
from frontier import arguments as frontier_arguments
from frontier_store import PROTOCOL, read

from heedful.evaluate import aopc_ceiling, evaluate, get_protocol
from heedful.evaluate.intervals import bootstrap_mean, bootstrap_paired_difference
from heedful.evaluate.store import ResultsStore
from heedful.files.cache import heedful_home
from heedful.render.progress import MODES, show_progress

ROOT = Path(__file__).resolve().parent.parent
MODEL = "minilm-sentiment"
ROWS = ("solvability_beam[trailing_specials=true]", "solvability_beam[objective=both,trailing_specials=true]",
        "solvability_beam[beam=1,shortlist=5,trailing_specials=true]", "lime")
PEER = "lime"
"""The row each share is read against: the best peer row of the frontier."""


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated frontier rows (a row's options in brackets)")
    parser.add_argument("--n", type=int, default=40, help="the frontier's first N sentences (each row on those it has)")
    parser.add_argument("--pool", type=int, default=10, help="top tokens reordered (at most 2^P passes per sentence)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--store", type=Path, default=heedful_home() / "frontier")
    parser.add_argument("--progress", choices=MODES, default="auto")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "search-optimality.md")
    args = parser.parse_args(argv)
    if not 1 <= args.pool <= 20:
        parser.error(f"--pool must be 1 to 20 (2^P forward passes per sentence at most), got {args.pool}")
    if args.n < 1:
        parser.error(f"--n must be at least 1, got {args.n}")
    args.rows = labels(args.rows)
    args.frontier = ["--models", MODEL, "--n", str(args.n), "--store", str(args.store), "--report-only"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    torch.set_num_threads(args.threads)
    load_before, began = os.getloadavg()[0], time.perf_counter()
    rows = [*args.rows, *([PEER] if PEER not in args.rows else [])]
    with show_progress(args.progress):
        front, _, _, _ = setup(MODEL, MODELS[MODEL], frontier_arguments(args.frontier))
        with ResultsStore(args.store) as store:
            reading = read(store, front, rows)
            stored = {label: store.get_explanations(front.run(label).key, front.ids) for label in rows}
        missing = [label for label in rows if not stored[label]]
        if missing:
            print(f"error: the store holds no explanation of {', '.join(missing)} on the first {args.n} sentences; {args.out} is left as it was\n"
                  "  hint: measure them with benchmarks/frontier.py first", file=sys.stderr)
            return 2
        protocol = get_protocol(PROTOCOL, removal="mask")
        found, check, passes = {}, 0.0, {}
        for label in rows:
            have = [j for j, i in enumerate(front.ids) if i in stored[label]]
            explanations = [stored[label][front.ids[j]] for j in have]
            pooled = aopc_ceiling(front.model, explanations, protocol, pool=args.pool)
            scored = evaluate(front.model, pooled.explanations, "aopc", protocol)["aopc"].per_example.values
            check = max(check, float(np.max(np.abs(scored - pooled.values))))
            values = np.full(len(front.ids), np.nan)
            values[have] = pooled.values
            found[label], passes[label] = values, float(np.mean(pooled.forwards))
    peer = np.where(np.isfinite(found[PEER]), reading.values["aopc_mask"][PEER], np.nan)
    lines = [
        "# Search optimality: the best reordering of each row's own top tokens",
        "",
        f"`{MODEL}`, the frontier's first {args.n} movie test sentences (each row on those it has stored), protocol `{PROTOCOL}`, "
        f"`[MASK]` operator. For each row, its stored explanation's top **{args.pool}** tokens are reordered in the best way the "
        f"removal curve rewards and the rest kept in the row's order (`heedful.evaluate.aopc_ceiling(..., pool={args.pool})`: dynamic "
        "programming over every subset of those tokens a ratio removes, exact for that set of orderings), on sentences of any "
        "length. A row whose best reordering scores what it already scores has ordered its candidates as well as they can be "
        "ordered; what separates it from a larger margin over a peer is then which tokens it ranks first, not how it orders them. "
        f"Shares: ratio of the means over the sentences both have, with the 95 % paired bootstrap interval of the per-sentence "
        f"difference mapped onto it. Check: the reorderings found, scored by `heedful.evaluate.evaluate`, differ from the "
        f"search's values by at most {check:.1e}.",
        "",
        f"| row | offered by | sentences | AOPC [MASK] stored | best reordering of its top {args.pool} | gain (paired) | row's share of `{PEER}` | "
        f"reordering's share of `{PEER}` | passes per sentence |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in rows:
        best = found[label]
        own = np.where(np.isfinite(best), reading.values["aopc_mask"][label], np.nan)
        on = np.isfinite(best) & np.isfinite(own)
        m, lo, hi = bootstrap_mean(own[on])
        bm, blo, bhi = bootstrap_mean(best[on])
        d, dlo, dhi = bootstrap_paired_difference(best[on], own[on])
        row_share, rlo, rhi = share_of(own, peer)
        best_share, slo, shi = share_of(best, peer)
        peers = offered(label)
        lines.append(
            f"| `{label}` | {peers or ('--' if peers == '' else 'heedful')} | {int(on.sum())} | {m:.4f} [{lo:.4f}, {hi:.4f}] | "
            f"{bm:.4f} [{blo:.4f}, {bhi:.4f}] | {d:+.4f} [{dlo:+.4f}, {dhi:+.4f}] | {100 * row_share:.1f}% [{100 * rlo:.1f}, {100 * rhi:.1f}] | "
            f"{100 * best_share:.1f}% [{100 * slo:.1f}, {100 * shi:.1f}] | {passes[label]:,.0f} |"
        )
    lines += [
        "",
        "- Exact for the orderings that keep a row's top tokens first: a better ordering that brings in other tokens earlier is "
        "not searched (the exact ceiling over every ordering is `docs/results/aopc-ceiling.md`, on short sentences).",
        "",
        command_line(),
        run_line((time.perf_counter() - began) / 60, load_before, args.threads),
        f"- rows' explanations and values from the results store `{args.store}`",
        f"- {library_versions('torch', 'transformers')}",
    ]
    write_results(args.out, "\n".join(lines) + "\n")
    print("\n".join(line for line in lines if line.startswith("| `")))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
