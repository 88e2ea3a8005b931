"""Cost of the relevance methods against gradient x input, and AttnLRP against the lxt package.

Part 1 -- for the first ``--n`` sentences of the movies test split and ``--model`` (default the
zoo's ``minilm-sentiment``), every relevance method runs through ``model.explain(texts, method,
batch_size=--batch-size)`` and its wall time is given as a ratio to ``grad_x_input`` run the same
way. Targets: ``attnlrp`` <= 2x, ``chefer`` and ``mask_lrp`` <= 4x.
``mask_lrp`` uses ``--head-mask`` if given, else the model's cached mask, else (so as not to
spend minutes on head statistics inside a benchmark) a random mask at 25 % -- the cost does not
depend on which heads are kept.

Part 2 -- AttnLRP against lxt (Achtibat et al.'s reference implementation, ``lxt.efficient``) on
``--lxt-model`` (default the zoo's ``smollm2-135m``, a Llama; ``--tiny`` uses a seeded tiny
Llama): on the same encoded batch, the time of heedful's AttnLRP (forward + modified backward,
:func:`heedful.lrp.propagate`) against lxt's (its patches applied, forward + backward, input x
gradient), and the Pearson correlation and largest relative difference of the two relevances
per sentence. lxt runs in a subprocess, because its patches replace ``transformers`` classes'
methods for the whole process; the subprocess times both sides, alternating, with lxt's patches
applied and removed between runs.

lxt on PyPI (2.1) was written for transformers 4: installed with its dependencies it would
replace torch 2.13 (it pins nothing but pulls bitsandbytes, open_clip_torch, timm, torchvision),
so it is installed with ``pip install --no-deps lxt==2.1``; ``import lxt.efficient`` then fails
on transformers 5 (its BERT module imports ``find_pruneable_heads_and_indices``), and its
attention patch replaces ``ALL_ATTENTION_FUNCTIONS`` by a plain dict. This script imports lxt's
Llama patches without its package ``__init__`` and wraps the dict back into an
``AttentionInterface`` -- nothing else of lxt is changed. lxt cannot run on BERT here, hence the
Llama model for part 2.

Timing: ``torch.set_num_threads(--threads)``; a warm-up run, then ``--repeats`` timed runs whose
median is reported; the runs of the methods are interleaved so that load from other processes
falls on all alike.

    python benchmarks/relevance_methods.py [--model minilm-sentiment] [--n 64] [--repeats 3]
        [--lxt-model smollm2-135m] [--lxt-n 16] [--head-mask FILE] [--tiny]
        [--out benchmarks/results/relevance_methods.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _shared import command_line, write_results  # noqa: E402  (benchmarks/ is the script's folder)

import heedful
from heedful.datasets import load_split
from heedful.files.cache import heedful_home

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
METHODS = (
    "attnlrp",
    "lrp",
    "partial_lrp",
    "chefer",
    "mask_lrp",
    "cam",
    "attention_gradcam",
    "gae",
    "grad_sam",
    "attcat",
)
TARGETS = {"attnlrp": 2.0, "chefer": 4.0, "mask_lrp": 4.0}


def load_model(
    name: str, tiny: bool, family: str = "bert", task: str = "classification"
) -> heedful.Model:
    if tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import tiny_model

        return tiny_model(family, task, initializer_range=0.2)
    folder = Path(name).expanduser()
    cached = heedful_home() / "models" / name
    # load a built zoo model from its folder (no build, no waiting on another process's build lock)
    return heedful.load(str(cached) if not folder.is_dir() and cached.is_dir() else name)


def head_mask_for(model: heedful.Model, path: str | None) -> tuple[list[list[int]], str]:
    from heedful.lrp.masks import HeadMask, cache_path

    if path:
        return HeadMask.load(path).mask.astype(int).tolist(), f"`{path}`"
    cached = cache_path(model)
    if cached.is_file():
        mask = HeadMask.load(cached)
        return mask.mask.astype(int).tolist(), f"cached mask `{cached}` (rate {mask.rate:.1%})"
    shape = (model.adapter.num_layers, model.adapter.config.num_attention_heads)
    mask = (np.random.default_rng(0).random(shape) < 0.25).astype(int)
    return mask.tolist(), "random mask at 25 % (no cached mask)"


def timed(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Warm-up, then ``repeats`` rounds running every function once, in alternating order."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------------- part 1
def part_one(args: argparse.Namespace) -> tuple[list[str], dict[str, float]]:
    model = load_model(args.model, args.tiny)
    texts = load_split("movies", "test")["text"].tolist()[: args.n]
    mask, mask_source = head_mask_for(model, args.head_mask)
    options = {"mask_lrp": {"head_mask": mask}}
    methods = ["grad_x_input", *[m for m in METHODS if m in {i.name for i in heedful.methods()}]]
    fns = {
        m: (lambda m=m: model.explain(texts, m, batch_size=args.batch_size, **options.get(m, {})))
        for m in methods
    }
    times = timed(fns, args.repeats)
    unit = statistics.median(times["grad_x_input"])
    ratios = {m: statistics.median(t) / unit for m, t in times.items()}
    costs = {m: model.explain(texts[0], m, **options.get(m, {})).cost for m in methods}
    lines = [
        f"## Relevance methods on `{Path(model.name).name}` ({len(texts)} movies test sentences, batch size {args.batch_size})",
        "",
        f"Unit: `grad_x_input`, median {unit:.3f} s for all sentences. `mask_lrp` uses the {mask_source}.",
        "",
        "| method | median s | x grad_x_input | passes / example (fwd, bwd) | target |",
        "|---|---:|---:|---|---|",
    ]
    for m in methods:
        target = TARGETS.get(m)
        verdict = (
            ""
            if target is None
            else (f"<= {target:g}x: " + ("met" if ratios[m] <= target else "**missed**"))
        )
        c = costs[m]
        lines.append(
            f"| `{m}` | {statistics.median(times[m]):.3f} | {ratios[m]:.2f} | {c.forward_passes:g}, {c.backward_passes:g} | {verdict} |"
        )
    return lines, ratios


# ---------------------------------------------------------------------- part 2 (subprocess)
LXT_CHILD = r"""
import importlib, json, os, statistics, sys, time, types
import torch
sys.path.insert(0, {tests!r})
torch.set_num_threads({threads})
import heedful, lxt
from transformers import AttentionInterface
from heedful.lrp import AttnLRPRules, propagate

if {tiny}:
    from tiny import tiny_model
    model = tiny_model("llama", "causal_lm", initializer_range=0.2)
else:
    model = heedful.load({model!r})
texts = {texts!r}
a = model.adapter
family = model.hf_model.config.model_type
problem = model.prepare(texts)
batch, target = problem.batch, problem.target

base = os.path.dirname(lxt.__file__)
for name in ("lxt.efficient", "lxt.efficient.models"):  # skip lxt's package __init__ (its BERT module needs transformers 4)
    mod = types.ModuleType(name); mod.__path__ = [os.path.join(base, *name.split(".")[1:])]; sys.modules[name] = mod
patches = importlib.import_module("lxt.efficient.models." + {{"mistral": "llama"}}.get(family, family)).attnLRP
saved = {{}}
for t in patches:
    if isinstance(t, types.ModuleType):
        saved[t] = (t.eager_attention_forward, t.ALL_ATTENTION_FUNCTIONS)
    else:
        saved[t] = t.forward

def patch():
    for t, p in patches.items():
        if isinstance(t, types.ModuleType):
            t.eager_attention_forward, t.ALL_ATTENTION_FUNCTIONS = saved[t]
        else:
            t.forward = saved[t]
        p(t)
        if isinstance(t, types.ModuleType) and isinstance(t.ALL_ATTENTION_FUNCTIONS, dict):
            iface = AttentionInterface(); iface._local_mapping.update(t.ALL_ATTENTION_FUNCTIONS); t.ALL_ATTENTION_FUNCTIONS = iface

def unpatch():
    for t in patches:
        if isinstance(t, types.ModuleType):
            t.eager_attention_forward, t.ALL_ATTENTION_FUNCTIONS = saved[t]
        else:
            t.forward = saved[t]

def run_lxt():
    patch()
    try:
        emb = problem.word_embeddings().requires_grad_(True)
        fwd = problem.forward(inputs_embeds=emb)
        (g,) = torch.autograd.grad(target.score(fwd.logits).sum(), emb)
        return (emb * g).sum(-1).detach()
    finally:
        unpatch()

def run_ours():
    return propagate(a, batch, target, AttnLRPRules()).inputs.sum(-1)

fns = {{"heedful": run_ours, "lxt": run_lxt}}
for fn in fns.values():
    fn()
times = {{k: [] for k in fns}}
for r in range({repeats}):
    for k in (list(fns) if r % 2 == 0 else list(reversed(list(fns)))):
        t0 = time.perf_counter(); fns[k](); times[k].append(time.perf_counter() - t0)
ours, theirs = run_ours(), run_lxt()
corr, diff = [], []
for b in range(len(texts)):
    n = int(batch.lengths[b])
    x, y = ours[b, :n].double(), theirs[b, :n].double()
    corr.append(float(torch.corrcoef(torch.stack([x, y]))[0, 1]))
    diff.append(float((x - y).abs().max() / y.abs().max()))
print(json.dumps({{"model": model.name, "family": family, "layers": a.num_layers, "tokens": int(batch.attention_mask.sum()),
                  "width": int(batch.input_ids.shape[1]), "heedful": times["heedful"], "lxt": times["lxt"],
                  "corr_min": min(corr), "corr_mean": sum(corr) / len(corr), "reldiff_max": max(diff),
                  "lxt_version": getattr(lxt, "__version__", "2.1")}}))
"""


def part_two(args: argparse.Namespace) -> list[str]:
    try:
        import lxt  # noqa: F401
    except ImportError:
        return [
            "## AttnLRP against lxt",
            "",
            "lxt is not installed (`pip install --no-deps lxt==2.1`); skipped.",
        ]
    texts = load_split("movies", "test")["text"].tolist()[: args.lxt_n]
    model = args.lxt_model
    if not args.tiny and not Path(model).expanduser().is_dir():
        cached = heedful_home() / "models" / model
        model = str(cached) if cached.is_dir() else model
    script = LXT_CHILD.format(
        tests=str(ROOT / "tests"),
        threads=args.threads,
        tiny=args.tiny,
        model=model,
        texts=texts,
        repeats=args.repeats,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(script)
    try:
        done = subprocess.run(
            [sys.executable, handle.name],
            capture_output=True,
            text=True,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
        )
    finally:
        os.unlink(handle.name)
    if done.returncode != 0:
        return [
            "## AttnLRP against lxt",
            "",
            "The lxt run failed:",
            "",
            "```",
            done.stderr[-3000:],
            "```",
        ]
    res = json.loads(done.stdout.strip().splitlines()[-1])
    ours, theirs = statistics.median(res["heedful"]), statistics.median(res["lxt"])
    verdict = "met" if ours <= theirs * 1.05 else "**missed**"
    return [
        f"## AttnLRP against lxt {res['lxt_version']} on `{Path(res['model']).name}` ({res['family']}, {res['layers']} layers)",
        "",
        f"{args.lxt_n} movies test sentences in one padded batch ({res['tokens']} real tokens, width {res['width']}); "
        "target: the predicted next token's logit; relevance = input x modified gradient at the word embeddings.",
        "",
        "| | median s (forward + backward) | ratio |",
        "|---|---:|---:|",
        f"| heedful `attnlrp` (`heedful.lrp.propagate`) | {ours:.3f} | {ours / theirs:.2f} |",
        f"| lxt `efficient` (patched model) | {theirs:.3f} | 1.00 |",
        "",
        f"Agreement per sentence: Pearson correlation min {res['corr_min']:.6f}, mean {res['corr_mean']:.6f}; "
        f"largest |difference| / max |relevance| {res['reldiff_max']:.2e}.",
        f'Target "not slower than lxt" (within 5 % timing noise): {verdict}.',
    ]


def machine_lines(args: argparse.Namespace) -> list[str]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return [
        "## Machine",
        "",
        command_line(),
        f"- {platform.platform()}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, {args.threads} torch thread(s), load average {load[0]:.1f} at the end",
        f"- {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}; {args.repeats} timed runs per method (median), "
        "interleaved; shared machine, so ratios are more reliable than seconds",
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="minilm-sentiment")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--head-mask", default=None)
    p.add_argument("--lxt-model", default="smollm2-135m")
    p.add_argument("--lxt-n", type=int, default=16)
    p.add_argument("--skip-lxt", action="store_true")
    p.add_argument(
        "--tiny", action="store_true", help="seeded tiny models (a smoke test of this script)"
    )
    p.add_argument("--out", type=Path, default=HERE / "results" / "relevance_methods.md")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    lines = ["# Relevance methods: cost and agreement with lxt", ""]
    part1, ratios = part_one(args)
    lines += part1 + [""]
    if not args.skip_lxt:
        lines += part_two(args) + [""]
    lines += machine_lines(args)
    text = "\n".join(lines) + "\n"
    write_results(args.out, text)
    print(args.out.read_text(encoding="utf-8"))
    return 0 if all(ratios.get(m, 0) <= t for m, t in TARGETS.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
