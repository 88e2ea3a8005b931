"""What the benchmark scripts share: loading the model and texts, formatting times, and the
machine description written under every results file."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from pathlib import Path

import heedful

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
    return [example.text for example in heedful.datasets.load("movies", "test", n=args.n)]


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
