"""Data sets heedful can evaluate on: ``heedful.datasets.load(name, split, n)``.

The VADER snippet sets (:mod:`heedful.datasets.vader`) with lexicon-derived evidence
(:mod:`heedful.datasets.evidence`), generated agreement minimal pairs
(:mod:`heedful.datasets.agreement`), planted long contexts whose answer source is known
(:mod:`heedful.datasets.planted`), the user's CSV / JSONL files (:mod:`heedful.datasets.user`)
and JSON lines of context documents (:mod:`heedful.datasets.context`), all as a
:class:`Dataset` of :class:`Example`.
"""

from heedful.datasets.examples import Dataset, Example
from heedful.datasets.loading import (
    NAMES,
    SENTIMENT_LABELS,
    load,
    register_dataset,
    unregister_dataset,
)
from heedful.datasets.vader import (
    SNIPPET_FILES,
    SPLIT_SEED,
    TEST_SIZES,
    load_snippets,
    load_split,
    vader_lexicon,
)

__all__ = [
    "NAMES",
    "SENTIMENT_LABELS",
    "SNIPPET_FILES",
    "SPLIT_SEED",
    "TEST_SIZES",
    "Dataset",
    "Example",
    "load",
    "load_snippets",
    "load_split",
    "register_dataset",
    "unregister_dataset",
    "vader_lexicon",
]
