"""``hierarchical`` against exact cached leave-one-source-out, back to back in one process, on
the planted documents of ``benchmarks/context.py``: per document the wall time and positions
computed of each (the same hook as the context benchmark), and whether their top sources agree.
One JSON line per document, written as soon as it is done (a loaded machine may stop a run
early; the ratio of two back-to-back calls stays meaningful under load).

    python benchmarks/hierarchical_speed.py --length 512 --docs 10 [--first 0] [--keep K] [--threads 1] > out.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

import numpy as np
from context import position_counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--docs", type=int, default=10)
    parser.add_argument("--first", type=int, default=0, help="skip this many documents")
    parser.add_argument("--keep", type=int, default=None, help="hierarchical's keep (default: its own)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-memory", default="4GB")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    import heedful
    from heedful import datasets

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    lm = heedful.load(args.model, max_memory=args.max_memory)
    data = datasets.load("planted", "test", n=args.first + args.docs, length=args.length, tokenizer=lm.tokenizer, seed=args.seed)
    positions = position_counter(lm)
    lm.explain(data[0].text[:200], "saliency")  # warm-up
    for i, ex in enumerate(list(data)[args.first :], start=args.first):
        spans = [tuple(s) for s in ex.meta["sources"]]
        row: dict = {"doc": i, "length": args.length, "sources": len(spans), "planted": ex.meta["answer_source"]}
        for label, method, options in (("loo", "source_loo", {}), ("hier", "hierarchical", {} if args.keep is None else {"keep": args.keep})):
            positions[0] = 0
            began = time.perf_counter()
            e = lm.explain(ex.text, method, target=ex.target, sources=spans, **options)
            row[f"{label}_seconds"] = time.perf_counter() - began
            row[f"{label}_positions"] = positions[0]
            row[f"{label}_scores"] = e.source_scores().scores.tolist()
            row["tokens"] = len(e.tokens)
            if label == "hier":
                row["kept"] = e.details["kept_sources"][0] if isinstance(e.details["kept_sources"][0], list) else e.details["kept_sources"]
        row["top1_agree"] = int(np.argmax(row["hier_scores"])) == int(np.argmax(row["loo_scores"]))
        print(json.dumps(row), flush=True)
        print(
            f"doc {i}: {row['tokens']} tokens, {row['sources']} sources; LOO {row['loo_seconds']:.1f} s, hierarchical {row['hier_seconds']:.1f} s "
            f"({row['loo_seconds'] / row['hier_seconds']:.1f}x); top-1 agree {row['top1_agree']}",
            file=sys.stderr, flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
