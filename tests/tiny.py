"""The tiny seeded models of the tests: they live in :mod:`heedful.testing` (public, so that
users checking their own methods get the same ones); re-exported under the tests' names."""

from __future__ import annotations

from heedful.testing import (
    CORPUS,
    DECODERS,
    ENCODERS,
    bytelevel_tokenizer,
    tiny_hf,
    tiny_model,
    tokenizer_for,
    wordpiece_tokenizer,
)
from heedful.testing import MODEL_FAMILIES as FAMILIES

__all__ = [
    "CORPUS",
    "DECODERS",
    "ENCODERS",
    "FAMILIES",
    "bytelevel_tokenizer",
    "tiny_hf",
    "tiny_model",
    "tokenizer_for",
    "wordpiece_tokenizer",
]
