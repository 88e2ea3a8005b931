"""A model stored in half precision (``heedful.load(..., dtype=torch.bfloat16)``, ``--dtype``)
against the same model in float32: per method, how far the scores move and how fast it runs.

For every registered method that serves the model's task (context methods aside) this script
explains ``--text`` with the float32 model and with its bf16 and fp16 copies (the same
weights, cast), with the tests' cheap settings (:func:`heedful.testing.fast_options`: few
steps and samples, seeded), and records

* the largest ``|score_half - score_fp32|`` over the tokens, relative to the largest
  ``|score_fp32|`` (0: the same scores);
* the speed ratio ``time_fp32 / time_half`` (median of ``--repeats`` interleaved runs after a
  warm-up; above 1: the half-precision model is faster);
* the machine line (:func:`heedful.engine.precision.support`): without AVX-512 BF16 / AMX (x86) every
  bfloat16 product is emulated and runs several times slower than float32.

It writes ``--out`` (JSON), which ``heedful models --families --markdown`` renders as the
half-precision table of ``docs/models.md``.

    python benchmarks/half_precision.py [--model tiny-llama | smollm2-135m] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _shared import library_versions, machine_header  # noqa: E402  (benchmarks/ is the script's folder)

import heedful
from heedful.engine.precision import DTYPES as DTYPE_OF
from heedful.registry import registered
from heedful.testing import fast_options, tiny_hf

HERE = Path(__file__).resolve().parent
DTYPES = ("bf16", "fp16")
TEXT = "a charming and often affecting journey"


def models(name: str) -> dict[str, heedful.Model]:
    """The float32 model and its half-precision copies, by dtype name."""
    found = {}
    for dtype in ("fp32", *DTYPES):
        if name.startswith("tiny-"):
            hf, tokenizer = tiny_hf(name.removeprefix("tiny-"), "causal_lm", initializer_range=0.2)
            found[dtype] = heedful.from_pretrained_objects(hf.to(DTYPE_OF[dtype]), tokenizer, name=name)
        else:
            found[dtype] = heedful.load(name, dtype=dtype, progress=False)
    return found


def timed(model: heedful.Model, method: str, options: dict) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    scores = np.asarray(model.explain(TEXT, method, **options).scores, dtype=np.float64)
    return scores, time.perf_counter() - start


def measure(loaded: dict[str, heedful.Model], repeats: int) -> list[dict]:
    rows = []
    base = loaded["fp32"]
    for name, info in registered().items():
        if not info.supports(base.task) or info.needs_sources:
            continue
        options = fast_options(info, base)
        row: dict = {"method": name}
        try:
            timed(base, name, options)  # warm-up
            for dtype in DTYPES:
                timed(loaded[dtype], name, options)
            times: dict[str, list[float]] = {d: [] for d in ("fp32", *DTYPES)}
            scores: dict[str, np.ndarray] = {}
            for _ in range(repeats):
                for dtype in ("fp32", *DTYPES):
                    scores[dtype], seconds = timed(loaded[dtype], name, options)
                    times[dtype].append(seconds)
        except heedful.UnsupportedModelError as refused:
            row["refused"] = str(refused).splitlines()[0]
            rows.append(row)
            continue
        scale = max(float(np.abs(scores["fp32"]).max()), 1e-12)
        for dtype in DTYPES:
            row[dtype] = {
                "difference": float(np.abs(scores[dtype] - scores["fp32"]).max()) / scale,
                "speed": statistics.median(times["fp32"]) / statistics.median(times[dtype]),
            }
        rows.append(row)
        print(name, {d: row[d] for d in DTYPES}, file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama", help="a zoo model, or tiny-FAMILY (the tests' tiny causal LM)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "half_precision.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    loaded = models(args.model)
    base = loaded["fp32"]
    rows = measure(loaded, args.repeats)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    record = {
        "model": args.model,
        "parameters": sum(p.numel() for p in base.hf_model.parameters()),
        "task": base.task,
        "text": TEXT,
        "tokens": len(base.explain(TEXT, "random").tokens),
        "machine": machine_header().removeprefix("> Machine: "),
        "threads": args.threads,
        "repeats": args.repeats,
        "versions": library_versions("torch", "transformers"),
        "commit": commit,
        "command": "python benchmarks/half_precision.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
