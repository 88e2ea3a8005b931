"""How far from the best possible ranking the frontier's methods are: the exact AOPC and
sufficiency ceilings (:mod:`heedful.evaluate.ceiling`) on the frontier's sentences short enough
for an exact search, against what each method stored in the frontier's results store scores on
the same sentences.

A removal curve rewards a ranking and nothing else, so on each sentence some ordering of its
tokens scores the most any explanation can. On a sentence of ``M`` eligible tokens the dynamic
programme over subsets finds it with at most ``2^M`` forward passes; ``--max-tokens`` (14 by
default) bounds ``M``. The report gives, per method, its mean AOPC [MASK] (and sufficiency
[MASK]) over those sentences, the share of the ceiling it reaches with a paired interval, and
the ceiling against the best method a peer offers: whether a margin over it is reachable at all
on these sentences. It reads the frontier's store and computes only the ceilings; run
``benchmarks/frontier.py`` first.

    python benchmarks/aopc_ceiling.py [--max-tokens 14] [--threads 2] [--store DIR]
        [--out docs/results/aopc-ceiling.md]
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
from frontier import MODELS, PEERS, offered, setup, share_of
from frontier import arguments as frontier_arguments
from frontier_store import PROTOCOL, read

from heedful.evaluate import evaluate, get_protocol
from heedful.evaluate.ceiling import MAX_TOKENS, aopc_ceiling
from heedful.evaluate.intervals import bootstrap_mean, bootstrap_paired_difference
from heedful.evaluate.store import ResultsStore
from heedful.files.cache import heedful_home
from heedful.render.progress import MODES, show_progress

ROOT = Path(__file__).resolve().parent.parent
MODEL = "minilm-sentiment"
COLUMNS = {"aopc": "aopc_mask", "sufficiency": "sufficiency_mask"}
"""Ceiling metric -> the frontier's column it bounds (the ``[MASK]`` operator)."""


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="longest sentence searched, in eligible tokens (2^M passes)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--store", type=Path, default=heedful_home() / "frontier")
    parser.add_argument("--progress", choices=MODES, default="auto")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "aopc-ceiling.md")
    args = parser.parse_args(argv)
    if not 1 <= args.max_tokens <= 20:
        parser.error(f"--max-tokens must be 1 to 20 (2^M forward passes per sentence), got {args.max_tokens}")
    args.frontier = ["--models", MODEL, "--store", str(args.store), "--report-only"]
    return args


def share(a: np.ndarray, b: np.ndarray) -> str:
    """``a`` as a share of ``b`` over the sentences both have, with its paired interval."""
    ratio, low, high = share_of(a, b)
    return f"{100 * ratio:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    torch.set_num_threads(args.threads)
    load_before, began = os.getloadavg()[0], time.perf_counter()
    with show_progress(args.progress):
        front, names, _, _ = setup(MODEL, MODELS[MODEL], frontier_arguments(args.frontier))
        with ResultsStore(args.store) as store:
            reading = read(store, front, names)
        model = front.model
        texts = [i.text for i in front.inputs]
        found = model.explain(texts, "random")  # the texts and their predicted classes; the ranking is replaced
        protocol = get_protocol(PROTOCOL, removal="mask")
        ceilings, check = {}, {}
        for metric in COLUMNS:
            ceilings[metric] = aopc_ceiling(model, found, protocol, metric=metric, max_tokens=args.max_tokens)
            kept = [e for e in ceilings[metric].explanations if e is not None]
            scored = evaluate(model, kept, metric, protocol)[metric].per_example.values
            check[metric] = float(np.max(np.abs(scored - ceilings[metric].values[np.isfinite(ceilings[metric].values)])))
    searched = np.isfinite(ceilings["aopc"].values)
    n = int(searched.sum())
    if not n:
        print(f"error: no sentence has at most {args.max_tokens} eligible tokens; {args.out} is left as it was\n"
              "  hint: raise --max-tokens (each step doubles the passes)", file=sys.stderr)
        return 2
    forwards = ceilings["aopc"].forwards[searched]
    lines = [
        "# The AOPC ceiling: the best ranking a removal curve can reward",
        "",
        f"`{MODEL}`, the frontier's {len(texts)} movie test sentences, of which the **{n}** with at most {args.max_tokens} eligible "
        f"tokens (protocol `{PROTOCOL}`, `[MASK]` operator: every token but [CLS]) are searched exactly: dynamic programming over every subset "
        f"of a sentence's tokens a ratio removes (`heedful.evaluate.ceiling.aopc_ceiling`; {int(forwards.sum()):,} forward passes, "
        f"{int(forwards.min()):,} to {int(forwards.max()):,} per sentence, for each of AOPC and sufficiency). "
        "The ceiling is the largest AOPC [MASK] (smallest sufficiency [MASK]) any explanation can score on the sentence; each "
        "method's values are what `benchmarks/frontier.py` stored for it on the same sentences. Shares: ratio of the means "
        "over the sentences both have, with the 95 % paired bootstrap interval of the per-sentence difference mapped onto it. "
        f"Check: the orderings found, scored by `heedful.evaluate.evaluate`, differ from the search's values by at most "
        f"{max(check.values()):.1e}.",
        "",
        "| method | offered by | sentences | AOPC [MASK] | share of the AOPC ceiling | suff. [MASK] | suff. ceiling minus method |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    best = ceilings["aopc"].values
    low_suff = ceilings["sufficiency"].values
    m, lo, hi = bootstrap_mean(best[searched])
    sm, slo, shi = bootstrap_mean(low_suff[searched])
    lines.append(f"| **ceiling** (exact) | -- | {n} | {m:.3f} [{lo:.3f}, {hi:.3f}] | 100% | {sm:.3f} [{slo:.3f}, {shi:.3f}] | 0 |")
    rows = []
    for label in reading.reached:
        aopc = reading.values["aopc_mask"][label]
        suff = reading.values["sufficiency_mask"][label]
        on = searched & np.isfinite(aopc)
        if not on.any():
            continue
        am, alo, ahi = bootstrap_mean(aopc[on])
        d, dlo, dhi = bootstrap_paired_difference(low_suff[on], suff[on])
        peers = offered(label)
        rows.append((am, f"| `{label}` | {peers or ('--' if peers == '' else 'heedful')} | {int(on.sum())} | {am:.3f} [{alo:.3f}, {ahi:.3f}] | "
                         f"{share(np.where(on, aopc, np.nan), best)} | {np.mean(suff[on]):.3f} | {d:+.3f} [{dlo:+.3f}, {dhi:+.3f}] |"))
    lines += [row for _, row in sorted(rows, key=lambda r: -r[0])]
    peer_rows = [label for label in reading.reached if offered(label) and np.isfinite(reading.values["aopc_mask"][label][searched]).all()]
    lines += ["", "## What a margin over the best peer can be on these sentences", ""]
    if peer_rows:
        top = max(peer_rows, key=lambda label: np.mean(reading.values["aopc_mask"][label][searched]))
        theirs = np.where(searched, reading.values["aopc_mask"][top], np.nan)
        lines.append(
            f"- The best method a peer offers here is `{top}` ({offered(top)}). No explanation can score more than the ceiling: "
            f"the ceiling is {share(best, theirs)} of `{top}`'s AOPC [MASK] on these {n} sentences, so that is the most any method can beat it by here."
        )
    lines += [
        "- The ceiling is exact for this protocol and operator only; under deletion or sampled replacement the same ordering is "
        "not the best, and a method tuned to it can score lower there (the frontier's other columns).",
        f"- Sentences of more than {args.max_tokens} tokens are not searched (2^M passes); on them the gap between a method and "
        "the best ranking is not measured here.",
        "",
        command_line(),
        run_line((time.perf_counter() - began) / 60, load_before, args.threads),
        f"- methods' values from the results store `{args.store}`; peers as in `benchmarks/frontier.py` ({len(PEERS)} methods offered by one)",
        f"- {library_versions('torch', 'transformers')}",
    ]
    write_results(args.out, "\n".join(lines) + "\n")
    print("\n".join(line for line in lines if line.startswith("- The best")))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
