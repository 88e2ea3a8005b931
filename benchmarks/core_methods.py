"""Speed of heedful's core methods against one forward pass, and against Captum.

For the first ``--n`` held-out sentences of the movies test split and the zoo model
``minilm-sentiment`` this script

1. times one plain batched forward pass of all sentences (no grad, one batch, the model as
   heedful loads it) -- the unit every method is measured in;
2. times every registered method through ``model.explain(texts, method, batch_size=n)``
   (integrated gradients with 50 steps, SmoothGrad with its defaults) and gives its ratio to
   the forward pass;
3. runs Captum on the same ``transformers`` model and the same encoded batch for saliency
   (``Saliency``), gradient x input (``InputXGradient``), integrated gradients
   (``LayerIntegratedGradients`` on the word-embedding layer, same steps, rule and baseline;
   ``internal_batch_size`` by default the rows heedful's own token budget allows, since all
   ``n x 50`` rows in one batch need about 20 GB -- ``--captum-ig-batch none`` leaves it unset)
   and leave-one-out (``FeatureAblation`` with one feature per content token, ``[MASK]`` as
   baseline), and gives the speed ratio Captum / heedful and the largest absolute difference
   between the two attributions on real tokens;
4. writes a markdown table with machine information to ``--out`` and prints it.

Timing: ``torch.set_num_threads`` is fixed for both sides; each measurement has a warm-up run,
then ``--repeats`` timed runs whose median is reported. Runs of the two sides being compared
are interleaved (alternating order), so that load from other processes falls on both alike.

heedful's time is the whole ``model.explain`` call (tokenization, the reference forward that
resolves the predicted class, the method, building the Explanations). Captum's time is its
``attribute`` call alone, with the target classes handed to it -- the comparison leans towards
Captum, not heedful.

    python benchmarks/core_methods.py [--model minilm-sentiment] [--n 64] [--repeats 3]
                                      [--out benchmarks/results/core_methods.md]
                                      [--core | --methods NAME...] [--skip NAME...] [--tiny]

Every registered method is timed unless ``--core`` (the vector, gradient, attention and
leave-one-out methods), ``--methods`` or
``--skip`` say otherwise; some later methods run hundreds to thousands of passes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _shared import (  # noqa: E402  (benchmarks/ is the script's folder)
    Timing,
    command_line,
    cpu_name,
    fmt_s,
    library_versions,
    load_model,
    measure,
    write_results,
)
from captum.attr import FeatureAblation, InputXGradient, LayerIntegratedGradients, Saliency
from rich.console import Console
from rich.markdown import Markdown

import heedful
from heedful.datasets import load_split
from heedful.engine.batch import Batch
from heedful.engine.chunks import TOKEN_BUDGET

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

IG_STEPS = 50
IG_RULE = "gausslegendre"
METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "integrated_gradients": {"n_steps": IG_STEPS, "baseline": "pad", "rule": IG_RULE},
    "smoothgrad": {},
}
NORMXLOGIT_TARGET = 1.3  # normxlogit <= 1.3 x a forward pass
IG_TARGET = 1.5  # heedful IG >= 1.5 x faster than Captum's LayerIntegratedGradients
STARTED = dt.datetime.now().astimezone()


# ---------------------------------------------------------------------------------- setup
def load_texts(n: int) -> list[str]:
    frame = load_split("movies", "test")
    if len(frame) < n:
        raise SystemExit(f"the movies test split has {len(frame)} sentences, fewer than --n {n}")
    return frame["text"].iloc[:n].tolist()


def model_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    if batch.token_type_ids is not None:
        inputs["token_type_ids"] = batch.token_type_ids
    return inputs


def scores_matrix(explanations: list[heedful.Explanation], batch: Batch) -> torch.Tensor:
    """heedful's per-token scores as a right-padded ``[B, N]`` tensor (float64)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float64)
    for b, e in enumerate(explanations):
        row = torch.as_tensor(np.asarray(e.scores, dtype=np.float64))
        out[b, : row.shape[-1]] = row
    return out


# ---------------------------------------------------------------------------------- Captum
class CaptumSide:
    """The standard Captum recipes for text, on heedful's ``transformers`` model and batch."""

    def __init__(
        self, model: heedful.Model, batch: Batch, ig_internal_batch_size: int | None
    ) -> None:
        self.ig_internal_batch_size = ig_internal_batch_size
        self.hf = model.hf_model
        self.adapter = model.adapter
        self.batch = batch
        self.ids = batch.input_ids
        self.mask = batch.attention_mask
        self.types = batch.token_type_ids
        self.embedding = self.hf.get_input_embeddings()
        with torch.no_grad():
            logits = self.hf(**model_inputs(batch)).logits
        self.target = logits.argmax(dim=-1)  # heedful's default target: the predicted class
        content = batch.content_mask
        # IG baseline: content tokens -> [PAD], special tokens kept (heedful's baseline="pad")
        self.pad_baseline = torch.where(
            content, torch.full_like(self.ids, self.adapter.pad_token_id), self.ids
        )
        # Leave-one-out: every content token its own feature (id = its position); special and
        # pad positions share feature 0, whose "ablation" puts the same token back (no change).
        positions = torch.arange(self.ids.shape[1]).expand_as(self.ids)
        self.feature_mask = torch.where(content, positions, torch.zeros_like(positions))
        removal = self.adapter.removal_token_id
        self.mask_baseline = torch.where(content, torch.full_like(self.ids, removal), self.ids)

    def _extra(self) -> tuple:
        return (self.mask, self.types)

    def from_embeds(self, embeds, attention_mask, token_type_ids):
        kwargs = {"inputs_embeds": embeds, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        return self.hf(**kwargs).logits

    def from_ids(self, input_ids, attention_mask, token_type_ids):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        return self.hf(**kwargs).logits

    def saliency(self) -> torch.Tensor:
        embeds = self.embedding(self.ids)
        attr = Saliency(self.from_embeds).attribute(
            embeds, target=self.target, additional_forward_args=self._extra(), abs=True
        )
        return attr.norm(dim=-1)

    def grad_x_input(self) -> torch.Tensor:
        embeds = self.embedding(self.ids)
        attr = InputXGradient(self.from_embeds).attribute(
            embeds, target=self.target, additional_forward_args=self._extra()
        )
        return attr.sum(dim=-1)

    def integrated_gradients(self) -> torch.Tensor:
        lig = LayerIntegratedGradients(self.from_ids, self.embedding)
        attr = lig.attribute(
            self.ids,
            baselines=self.pad_baseline,
            target=self.target,
            additional_forward_args=self._extra(),
            n_steps=IG_STEPS,
            method=IG_RULE,
            internal_batch_size=self.ig_internal_batch_size,
        )
        return attr.sum(dim=-1)

    def leave_one_out(self) -> torch.Tensor:
        with torch.no_grad():
            return FeatureAblation(self.from_ids).attribute(
                self.ids,
                baselines=self.mask_baseline,
                target=self.target,
                additional_forward_args=self._extra(),
                feature_mask=self.feature_mask,
            )


CAPTUM_RECIPES = {
    "saliency": ("Saliency", CaptumSide.saliency),
    "grad_x_input": ("InputXGradient", CaptumSide.grad_x_input),
    "integrated_gradients": ("LayerIntegratedGradients", CaptumSide.integrated_gradients),
    "leave_one_out": ("FeatureAblation", CaptumSide.leave_one_out),
}


# ---------------------------------------------------------------------------------- report
@dataclass
class Row:
    method: str
    family: str
    heedful: Timing
    forward: Timing
    captum_name: str | None = None
    captum: Timing | None = None
    max_diff: float | None = None
    max_score: float | None = None

    @property
    def ratio_forward(self) -> float:
        return self.heedful.median / self.forward.median

    @property
    def ratio_captum(self) -> float | None:
        return None if self.captum is None else self.captum.median / self.heedful.median

    @property
    def cpu_ratio_forward(self) -> float:
        return self.heedful.cpu_median / self.forward.cpu_median

    @property
    def cpu_ratio_captum(self) -> float | None:
        return None if self.captum is None else self.captum.cpu_median / self.heedful.cpu_median


def machine_info(
    model: heedful.Model,
    args: argparse.Namespace,
    batch: Batch,
    ig_chunk: int | None,
    loads: list[float],
) -> list[str]:
    cpu = cpu_name()
    versions = library_versions("torch", "transformers", "captum", "heedful")
    attn = getattr(model.hf_model.config, "_attn_implementation", "?")
    lengths = batch.lengths.float()
    params = sum(p.numel() for p in model.hf_model.parameters()) / 1e6
    return [
        command_line(),
        f"- date: {STARTED.isoformat(timespec='seconds')} (start of the run)",
        f"- machine: {platform.machine()}, {cpu}, {os.cpu_count()} logical cores, shared; torch "
        f"threads {torch.get_num_threads()} on both sides; 1-minute load average during the run "
        f"{min(loads):.1f}-{max(loads):.1f}",
        f"- python {platform.python_version()}, {versions}",
        f"- model: {model.name} ({model.adapter.family}, {model.task}, {params:.1f}M parameters, "
        f"attention {attn!r} as heedful loads it, used by both sides)",
        f"- inputs: first {len(batch)} sentences of the movies test split, one batch; padded length "
        f"{batch.seq_len}, real lengths mean {lengths.mean():.1f} (min {int(lengths.min())}, "
        f"max {int(lengths.max())})",
        f"- timing: 1 warm-up + at least {args.repeats} timed runs each (more, up to "
        f"{5 * args.repeats}, for quick methods until {args.min_seconds:.0f} s are spent; 1 where a "
        f"warm-up took over {args.long:.0f} s), median reported; the runs of the forward pass, "
        "heedful and Captum interleaved, alternating their order",
        "- Captum LayerIntegratedGradients: internal_batch_size "
        + (
            "unset (all steps in one batch)"
            if ig_chunk is None
            else f"{ig_chunk} rows, the rows heedful's own token budget allows at the padded length "
            f"(unset puts all {len(batch) * IG_STEPS} rows in one batch; for 64 sentences on "
            "minilm-sentiment that takes about 20 GB)"
        ),
    ]


def render_markdown(
    rows: list[Row], forward: Timing, info: list[str], verdicts: list[str], skipped: list[str]
) -> str:
    lines = [
        "# heedful core methods: speed",
        "",
        f"Unit: one plain batched forward pass (no grad) = **{fmt_s(forward.median)}** "
        f"(median of all {len(forward.times)} forward runs, range {forward.spread} s).",
        "",
        "| method | family | runs | heedful | × forward | (CPU) | Captum recipe | Captum | Captum / heedful | (CPU) | max abs diff | max abs score |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        captum = "—" if r.captum is None else fmt_s(r.captum.median)
        ratio = "—" if r.ratio_captum is None else f"{r.ratio_captum:.2f}×"
        cpu_ratio = "—" if r.cpu_ratio_captum is None else f"{r.cpu_ratio_captum:.2f}×"
        diff = "—" if r.max_diff is None else f"{r.max_diff:.1e}"
        score = "—" if r.max_score is None else f"{r.max_score:.3g}"
        lines.append(
            f"| {r.method} | {r.family} | {len(r.heedful.times)} | {fmt_s(r.heedful.median)} | "
            f"{r.ratio_forward:.2f}× | {r.cpu_ratio_forward:.2f}× | {r.captum_name or '—'} | {captum} | "
            f"{ratio} | {cpu_ratio} | {diff} | {score} |"
        )
    lines += [
        "",
        "heedful: the whole `model.explain(texts, method, batch_size=n)` call (tokenization, the "
        "reference pass that resolves the predicted class, the method, the Explanations). Captum: "
        "its `attribute` call alone, target classes given. × forward: the method's median over the "
        "median of the forward runs interleaved with it; (CPU): the same ratio of process CPU times, "
        "less disturbed by other processes on a busy machine. Captum / heedful > 1: heedful is faster. "
        "Differences: on real (non-pad) tokens, Captum's `[B, N, D]` attributions reduced as heedful "
        "does (L2 norm over D for saliency, sum over D otherwise).",
    ]
    if skipped:
        lines += ["", "Not timed: " + ", ".join(skipped) + "."]
    lines += ["", "## Targets", "", *verdicts, "", "## Machine", "", *info, ""]
    return "\n".join(lines)


def verdict_lines(rows: list[Row]) -> list[str]:
    by_name = {r.method: r for r in rows}
    verdicts = []
    if "normxlogit" in by_name:
        r = by_name["normxlogit"]
        ok = r.ratio_forward <= NORMXLOGIT_TARGET
        verdicts.append(
            f"- normxlogit ≤ {NORMXLOGIT_TARGET}× a forward pass: **{'holds' if ok else 'missed'}** "
            f"({r.ratio_forward:.2f}× wall time; {r.cpu_ratio_forward:.2f}× CPU time)"
        )
    r = by_name.get("integrated_gradients")
    if r is not None and r.captum is not None:
        ok = r.ratio_captum >= IG_TARGET
        verdicts.append(
            f"- integrated gradients ≥ {IG_TARGET}× faster than Captum's LayerIntegratedGradients "
            f"at {IG_STEPS} steps: **{'holds' if ok else 'missed'}** ({r.ratio_captum:.2f}× wall "
            f"time; {r.cpu_ratio_captum:.2f}× CPU time)"
        )
    return verdicts


# ---------------------------------------------------------------------------------- main
CORE_METHODS = (
    "random",
    "embedding_norm",
    "logat",
    "normxlogit",
    "saliency",
    "grad_x_input",
    "integrated_gradients",
    "smoothgrad",
    "raw_attention",
    "rollout",
    "leave_one_out",
)
"""The core methods (``--core``)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-sentiment", help="zoo name or model directory")
    parser.add_argument(
        "--n", type=int, default=64, help="number of held-out sentences (one batch)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per measurement (median)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "core_methods.md")
    parser.add_argument(
        "--methods",
        nargs="+",
        metavar="NAME",
        help="only these methods (default: every registered one)",
    )
    parser.add_argument("--core", action="store_true", help="only the core methods")
    parser.add_argument("--skip", nargs="+", default=[], metavar="NAME", help="methods not to time")
    parser.add_argument(
        "--long",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="one timed run instead of --repeats when a warm-up run takes longer than this",
    )
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=60.0,
        help="quick methods get more timed rounds (up to 5 x --repeats) until this much time is spent",
    )
    parser.add_argument(
        "--captum-ig-batch",
        default="budget",
        metavar="ROWS|budget|none",
        help="internal_batch_size of Captum's LayerIntegratedGradients: 'budget' (default) = the rows "
        "heedful's token budget allows at the padded length, 'none' = unset (one batch of n x 50 rows)",
    )
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny random BERT instead (to debug the script)"
    )
    return parser.parse_args(argv)


def captum_ig_batch(option: str, batch: Batch) -> int | None:
    if option == "none":
        return None
    if option == "budget":
        return max(len(batch), TOKEN_BUDGET // batch.seq_len)
    return int(option)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 200)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", message=r".*were truncated")
    warnings.filterwarnings("ignore", message=r"Input Tensor \d+ did not already require gradients")
    loads = [os.getloadavg()[0]]

    model = load_model(args)
    texts = load_texts(args.n)
    batch = model.encode(texts)
    inputs = model_inputs(batch)
    hf = model.hf_model

    def plain_forward() -> torch.Tensor:
        with torch.no_grad():
            return hf(**inputs).logits

    registered = heedful.methods(task=model.task)
    wanted = set(args.methods or (CORE_METHODS if args.core else [m.name for m in registered]))
    infos = [m for m in registered if m.name in wanted and m.name not in args.skip]
    skipped = [m.name for m in registered if m not in infos]
    # the core methods first, so that an interrupted run still has the figures that matter
    run_order = sorted(infos, key=lambda m: m.name not in CORE_METHODS)
    ig_chunk = captum_ig_batch(args.captum_ig_batch, batch)
    captum = CaptumSide(model, batch, ig_chunk)
    real = batch.attention_mask.bool()
    all_forward = Timing()
    rows: dict[str, Row] = {}
    failed: list[str] = []

    def report() -> str:
        ordered = [rows[m.name] for m in infos if m.name in rows]
        info_lines = machine_info(model, args, batch, ig_chunk, loads)
        notes = skipped + [f"{name} (failed)" for name in failed]
        text = render_markdown(ordered, all_forward, info_lines, verdict_lines(ordered), notes)
        write_results(args.out, text)
        return text

    for info in run_order:
        options = METHOD_OPTIONS.get(info.name, {})

        def explain(name: str = info.name, opts: dict = options) -> list[heedful.Explanation]:
            return model.explain(texts, name, batch_size=args.n, **opts)

        fns: dict[str, Callable[[], Any]] = {"forward": plain_forward, "heedful": explain}
        recipe = CAPTUM_RECIPES.get(info.name)
        if recipe is not None:
            fns["captum"] = lambda fn=recipe[1]: fn(captum)
        console.print(f"[dim]timing {info.name} ...[/dim]")
        try:
            timed = measure(fns, args.repeats, long=args.long, min_seconds=args.min_seconds)
        except Exception as exc:  # one broken method must not lose the others' figures
            console.print(f"  [red]{info.name} failed: {type(exc).__name__}: {exc}[/red]")
            failed.append(info.name)
            continue
        loads.append(os.getloadavg()[0])
        all_forward.times.extend(timed["forward"].times)
        all_forward.cpu.extend(timed["forward"].cpu)
        row = Row(info.name, info.family, timed["heedful"], timed["forward"])
        if recipe is not None:
            ours = scores_matrix(timed["heedful"].result, batch)
            theirs = timed["captum"].result.detach().to(torch.float64)
            row.captum_name, row.captum = recipe[0], timed["captum"]
            row.max_diff = float((ours - theirs)[real].abs().max())
            row.max_score = float(ours[real].abs().max())
        rows[info.name] = row
        note = (
            ""
            if row.captum is None
            else f"; Captum {fmt_s(row.captum.median)} ({row.ratio_captum:.2f}×)"
        )
        console.print(
            f"  {info.name}: {fmt_s(row.heedful.median)} = {row.ratio_forward:.2f}× forward{note}"
        )
        report()

    console.print(Markdown(report()))
    console.print(f"[dim]written to {args.out}[/dim]")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
