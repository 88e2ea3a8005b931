"""What the benchmark scripts share: loading the model and texts, formatting times, the machine
line at the head of every results file (:func:`write_results`: processor, the flags lower
precision depends on, the measured speed of bf16 and int8 against fp32) and the machine
description under it."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markdown import Markdown

import heedful
from heedful import datasets
from heedful.engine.machine import cpuinfo, is_native
from heedful.engine.precision import support

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Timing:
    """Wall and process CPU times (seconds) of the timed runs, and the last run's result.

    CPU time is a cross-check for a busy machine: time slices lost to other processes inflate
    wall time but not CPU time (spin-waiting threads still count, so it is no exact measure).
    """

    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    result: Any = None

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def spread(self) -> str:
        return f"{min(self.times):.3g}-{max(self.times):.3g}"


def measure(
    fns: dict[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    long: float = float("inf"),
    min_seconds: float = 0.0,
    warmups: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, Timing]:
    """Time each function ``repeats`` times after ``warmup`` untimed runs (of ``warmups`` in
    their place when given: a cheaper call that warms the same code).

    The functions are interleaved, and their order is reversed on every other round, so that a
    burst of load from elsewhere on the machine is shared between them. Quick functions get
    more rounds (up to ``5 x repeats``) until a round has taken ``min_seconds`` in all; when a
    warm-up run took longer than ``long`` seconds, one timed run is made instead.
    """
    names = list(fns)
    slowest, round_time = 0.0, 0.0
    for _ in range(warmup):
        round_time = 0.0
        for fn in (warmups or fns).values():
            began = time.perf_counter()
            fn()
            took = time.perf_counter() - began
            slowest, round_time = max(slowest, took), round_time + took
    if slowest > long:
        repeats = 1
    elif round_time > 0:
        repeats = max(repeats, min(5 * repeats, math.ceil(min_seconds / round_time)))
    timings = {name: Timing() for name in names}
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            began, cpu = time.perf_counter(), time.process_time()
            result = fns[name]()
            timings[name].times.append(time.perf_counter() - began)
            timings[name].cpu.append(time.process_time() - cpu)
            timings[name].result = result
    return timings


def fmt_s(seconds: float) -> str:
    """``12.3 ms`` below a second, ``4.56 s`` above."""
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def load_model(args: argparse.Namespace, **tiny_overrides: object) -> heedful.Model:
    """``--model`` from the zoo, or with ``--tiny`` the tests' tiny BERT (config overrides given)."""
    if args.tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import tiny_model  # type: ignore[import-not-found]

        return tiny_model("bert", **tiny_overrides)
    return heedful.load(args.model)


def load_texts(args: argparse.Namespace) -> list[str]:
    """The first ``--n`` movies test sentences, or with ``--tiny`` the tests' corpus repeated."""
    if args.tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import CORPUS  # type: ignore[import-not-found]

        return [CORPUS[i % 10] + (" again" * (i // 10)) for i in range(args.n)]
    return [example.text for example in datasets.load("movies", "test", n=args.n)]


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what :mod:`platform` knows."""
    return cpuinfo()[0]


def machine_header() -> str:
    """The line under a results file's title: the processor, the flags lower precision depends
    on and the measured speed of bf16 and int8 against fp32 (:func:`heedful.engine.precision.support`,
    the probe ``heedful info`` shows), so that numbers from different machines are never
    compared as if they were equal."""
    found = support()
    return (
        f"> Machine: {found.processor} ({platform.machine()}, {os.cpu_count()} logical cores; {found.shown_flags()}). "
        f"Speed against fp32 measured by `heedful info` ({found.probe}, {found.threads} torch thread(s), "
        f"torch {found.torch}): {found.ratios()}."
    )


def precision_note(precision: str) -> str | None:
    """A sentence for a results file when this processor lacks the instructions for
    ``precision`` (by its flags) or the probe measured it no faster than fp32 -- targets that
    assume a fast ``precision`` are skipped then; ``None`` otherwise."""
    found = support()
    ratio = found.speed.get(precision)
    if ratio is None:
        return f"{precision} cannot run on {found.where()}."
    if found.faster(precision) and is_native(precision, found.flags) is not False:
        return None
    verdict = "slower than" if found.slower(precision) else "still faster than" if found.faster(precision) else "no faster than"
    return f"{found.processor} has {found.routes[precision]}: the probe ran {precision} at {ratio:.2f}x the speed of fp32, {verdict} fp32."


def write_results(path: Path, text: str) -> None:
    """Write a results file: ``text`` with :func:`machine_header` under its first line (the
    ``# title``; at the top when there is none)."""
    title, _, rest = text.partition("\n")
    if title.startswith("# "):
        text = f"{title}\n\n{machine_header()}\n\n{rest.lstrip()}"
    else:
        text = f"{machine_header()}\n\n{text}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def library_versions(*distributions: str) -> str:
    """``"torch 2.13.0, transformers 5.23.0, ..."`` for the installed distributions named."""
    return ", ".join(f"{d} {importlib.metadata.version(d)}" for d in distributions)


def run_line(minutes: float, load_before: float, threads: int) -> str:
    """The run's wall time, the load average before it and now, and its torch threads, as a
    Markdown bullet (a results file says how busy the machine was)."""
    return f"- run time {minutes:.1f} min; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; torch threads {threads}"


def command_line() -> str:
    """The command that made this results file, as a Markdown bullet."""
    script = Path(sys.argv[0])
    shown = f"benchmarks/{script.name}" if script.parent.name == "benchmarks" else str(script)
    return f"- command: `python {shlex.join([shown, *sys.argv[1:]])}`"


def machine_lines(
    model: heedful.Model, args: argparse.Namespace, texts: list[str], loads: tuple[float, float], versions: str,
    model_extra: str = "",
) -> list[str]:
    """The Markdown bullets every results file ends with: date, machine and load (``loads``: the
    1-minute load average before and after), library ``versions``, model, inputs and timing."""
    lengths = model.encode(texts).lengths.float()
    return [
        command_line(),
        f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {cpu_name()}, {os.cpu_count()} logical cores; torch threads "
        f"{torch.get_num_threads()} (both sides), OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}; load average {loads[0]:.2f} before, "
        f"{loads[1]:.2f} after (the machine is shared: other processes' load falls on both sides alike)",
        f"- python {platform.python_version()}, {versions}",
        f"- model: {model.name} ({model.adapter.family}, {model.task}, "
        f"{sum(p.numel() for p in model.hf_model.parameters()) / 1e6:.1f}M parameters{model_extra})",
        f"- inputs: {len(texts)} sentences ({'tiny corpus' if args.tiny else 'movies test split'}); "
        f"length mean {lengths.mean():.1f} tokens (min {int(lengths.min())}, max {int(lengths.max())})",
        f"- timing: warm-up + {args.repeats} timed run(s) each, median reported, sides interleaved",
    ]


def start(args: argparse.Namespace) -> tuple[Console, heedful.Model, list[str], float]:
    """Set-up shared by the comparison scripts: torch threads, quiet warnings, the model and
    texts; returns ``(console, model, texts, 1-minute load average before the run)``."""
    import warnings

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    load_before = os.getloadavg()[0]
    return Console(), load_model(args, initializer_range=0.2), load_texts(args), load_before


def finish(text: str, args: argparse.Namespace, console: Console) -> int:
    """Write the results Markdown to ``args.out`` (:func:`write_results`) and show it."""
    write_results(args.out, text)
    console.print(Markdown(args.out.read_text(encoding="utf-8")))
    console.print(f"[dim]written to {args.out}[/dim]")
    return 0


def emit(lines: list[str], notes: list[str], out: Path | None) -> None:
    """Print the results ``lines``, then the command line that made them and the ``notes``
    (Markdown bullets), and write them to ``out`` (:func:`write_results`) when given."""
    text = "\n".join([*lines, "", command_line(), *notes]) + "\n"
    print(text)
    if out is not None:
        write_results(out, text)
