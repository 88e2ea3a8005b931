"""Calibration of the memory estimator (:mod:`heedful.engine.memory`): the estimated peak of one pass
against the peak resident-memory increase it measures, for each kind of pass.

Each pass runs the way the runner runs a pass near the budget (``adapter.forward`` with
``checkpoint`` / ``release`` / ``prefill``, the backward through
:meth:`~heedful.adapters.ModelAdapter.grad`); its peak is
VmHWM after :func:`heedful.engine.memory.reset_peak_rss` (freed heap returned to the system, the mark
reset) minus VmRSS just before the pass, after one warm-up pass (the first pass pages in the
weights). Rows are random token ids; a padded chunk has its last row half padding.

Run (one thread; the smollm2-135m rows take ~15 minutes; ``--models llama,gpt2,bert`` measures
only the tiny models)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/memory_calibration.py [--models ...]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from _shared import write_results  # noqa: E402  (benchmarks/ is the script's folder)

import heedful
from heedful.adapters import ModelAdapter
from heedful.engine.memory import (
    FORWARD,
    Need,
    current_rss,
    estimate,
    format_bytes,
    peak_rss,
    reset_peak_rss,
)
from heedful.testing import tiny_model

SAVED = Need(grad="saved")
CHECKPOINT = Need(grad="checkpoint")


@dataclass
class Case:
    rows: int
    width: int
    need: Need
    padded: bool = False

    def label(self) -> str:
        pad = ", padded" if self.padded else ""
        eager = ", eager" if self.need.eager else ""
        return f"{self.rows} x {self.width}: {self.need.describe(self.width)}{eager}{pad}"


def run_pass(adapter: ModelAdapter, case: Case) -> None:
    """One pass of ``case`` as the runner runs it."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(adapter.tokenizer), (case.rows, case.width), generator=gen)
    mask = torch.ones_like(ids)
    if case.padded:
        mask[-1, case.width // 2 :] = 0
    anchor = mask.sum(dim=1) - 1 if adapter.is_decoder else torch.zeros(case.rows, dtype=torch.long)
    batch = _Plain(ids, mask)
    need = case.need
    inside = adapter.intercept() if need.eager and not need.attentions else contextlib.nullcontext()
    with inside:
        if need.grad == "none":
            with torch.no_grad():
                adapter.forward(
                    batch, anchor, hidden_states=need.hidden_states, attentions=need.attentions, prefill=need.queries
                )
        else:
            embeds = adapter.embed(ids).detach().requires_grad_(True)
            with torch.enable_grad():
                # as a pass near the budget runs: the heap's free pages given back after each block
                fwd = adapter.forward(batch, anchor, inputs_embeds=embeds, checkpoint=need.grad == "checkpoint", release=True)
                adapter.grad(fwd.logits[:, 0], embeds)


@dataclass
class _Plain:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None = None


def measure(adapter: ModelAdapter, case: Case) -> tuple[int, float]:
    """Peak resident-memory increase of one pass (bytes) and its seconds."""
    reset_peak_rss()
    base = current_rss()
    start = time.perf_counter()
    run_pass(adapter, case)
    return peak_rss() - base, time.perf_counter() - start


def tiny(family: str, task: str, positions: int = 2048):
    """A tiny model widened to ``positions`` positions, 4 layers of 8 heads, D 128, F 256."""
    width = {"n_embd": 128, "n_layer": 4, "n_head": 8, "n_positions": positions} if family == "gpt2" else {
        "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 256,
        "max_position_embeddings": positions,
    }
    return tiny_model(family, task, **width)


def cases_for(adapter: ModelAdapter, small: bool) -> list[Case]:
    eager = Need(eager=True)
    if small:
        n = 1024
        return [
            Case(8, n, FORWARD), Case(8, n, FORWARD, padded=True), Case(8, n, eager),
            Case(4, n, Need(attentions=True)), Case(8, n, Need(hidden_states=True)),
            Case(4, n, SAVED), Case(4, n, SAVED, padded=True), Case(2, n, replace(SAVED, eager=True)),
            Case(4, n, CHECKPOINT), Case(4, n, CHECKPOINT, padded=True),
            *([Case(1, 2 * n, replace(FORWARD, queries=256, padded=False)), Case(1, 2 * n, replace(eager, queries=256, padded=False))]
              if adapter.is_decoder else []),
        ]
    return [
        Case(1, 1024, FORWARD), Case(2, 2048, FORWARD, padded=True), Case(1, 4096, FORWARD),
        Case(1, 2048, Need(hidden_states=True)), Case(1, 1024, Need(attentions=True)), Case(1, 1024, eager),
        Case(1, 1024, SAVED), Case(2, 1024, SAVED, padded=True), Case(1, 2048, SAVED), Case(1, 512, replace(SAVED, eager=True)),
        Case(1, 2048, CHECKPOINT), Case(2, 1024, CHECKPOINT, padded=True), Case(1, 4096, CHECKPOINT),
        Case(1, 4096, replace(FORWARD, queries=512, padded=False)), Case(1, 4096, replace(eager, queries=512, padded=False)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,gpt2,bert,smollm2-135m", help="tiny families and zoo models to measure")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tasks = {"llama": "causal_lm", "gpt2": "causal_lm", "bert": "classification"}
    models = [
        (f"tiny {name}", tiny(name, tasks[name])) if name in tasks else (name, heedful.load(name))
        for name in args.models.split(",")
    ]
    lines = ["| model | pass | estimated | measured | estimated / measured | s |", "|---|---|---:|---:|---:|---:|"]
    print("\n".join(lines))
    for name, model in models:
        adapter = model.adapter
        small = name.startswith("tiny")
        run_pass(adapter, Case(1, 64, FORWARD))  # warm-up: pages the weights in
        for case in cases_for(adapter, small):
            if case.need.queries is None and not case.padded:
                case.need = replace(case.need, padded=False)
            guess = estimate(adapter.shape, case.rows, case.width, case.need)
            found, seconds = measure(adapter, case)
            lines.append(
                f"| {name} | {case.label()} | {format_bytes(guess)} | {format_bytes(found)} | {guess / max(found, 1):.2f} | {seconds:.1f} |"
            )
            print(lines[-1], flush=True)
    if args.out is not None:
        head = (
            "# Memory estimator: estimated against measured peaks\n\n"
            "One run of `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/memory_calibration.py` "
            f"(torch {torch.__version__}, one thread). Measured: VmHWM above VmRSS before the pass, "
            "after a warm-up pass; tiny models: D 128, 8 heads, 4 blocks, F 256.\n\n"
        )
        write_results(args.out, head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
