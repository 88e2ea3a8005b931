"""What the benchmark scripts share: loading the model and texts, formatting times, and the
machine description written under every results file."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import os
import platform
import shlex
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.markdown import Markdown

import heedful
from heedful import datasets

ROOT = Path(__file__).resolve().parent.parent


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
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def library_versions(*distributions: str) -> str:
    """``"torch 2.13.0, transformers 5.23.0, ..."`` for the installed distributions named."""
    return ", ".join(f"{d} {importlib.metadata.version(d)}" for d in distributions)


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
    """Write the results Markdown to ``args.out`` and show it."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    console.print(Markdown(text))
    console.print(f"[dim]written to {args.out}[/dim]")
    return 0
