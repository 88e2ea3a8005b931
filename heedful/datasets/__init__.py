"""Data sets heedful can obtain by itself (see :mod:`heedful.datasets.vader`)."""

from heedful.datasets.vader import (
    SNIPPET_FILES,
    SPLIT_SEED,
    TEST_SIZES,
    load_snippets,
    load_split,
    vader_lexicon,
)

__all__ = [
    "SNIPPET_FILES",
    "SPLIT_SEED",
    "TEST_SIZES",
    "load_snippets",
    "load_split",
    "vader_lexicon",
]
