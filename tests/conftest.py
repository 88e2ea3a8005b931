"""Shared set-up: ``tests/`` importable (``from tiny import tiny_model``), quiet transformers,
a sensible number of torch threads, and a session-wide cache of the tiny seeded models."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
warnings.filterwarnings("ignore", module="transformers")

from tiny import tiny_model  # noqa: E402

INIT_RANGE = 0.2
"""Weight scale of the cached models. With transformers' default (0.02) the encoders' logits
are ~1e-3 and nearly input-independent, so equality checks at 1e-5 would prove nothing; at 0.2
logits are O(1) and predictions vary between texts."""

_MODELS: dict[tuple[str, str], object] = {}


def cached_model(family: str, task: str = "classification"):
    """The tiny seeded :class:`heedful.Model` for ``(family, task)``, built once per session
    with weights drawn at ``INIT_RANGE``.

    Tests must not change the weights; ``model.hf_model`` is the underlying transformers model.
    """
    key = (family, task)
    if key not in _MODELS:
        scale = {"init_std" if family == "opt" else "initializer_range": INIT_RANGE}
        _MODELS[key] = tiny_model(family, task, **scale)
    return _MODELS[key]


@pytest.fixture(scope="session")
def tiny():
    """``tiny(family, task="classification")`` -> cached tiny :class:`heedful.Model`."""
    return cached_model
