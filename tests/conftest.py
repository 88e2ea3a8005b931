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

_MODELS: dict[tuple[str, str], object] = {}


def cached_model(family: str, task: str = "classification"):
    """The tiny seeded :class:`heedful.Model` for ``(family, task)``, built once per session.

    Tests must not change the weights; ``model.hf_model`` is the underlying transformers model.
    """
    key = (family, task)
    if key not in _MODELS:
        _MODELS[key] = tiny_model(family, task)
    return _MODELS[key]


@pytest.fixture(scope="session")
def tiny():
    """``tiny(family, task="classification")`` -> cached tiny :class:`heedful.Model`."""
    return cached_model
